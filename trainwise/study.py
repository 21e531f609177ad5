"""A study: validate and prepare once, then one trial per (strategy row, repeat), stored in SQLite.

`prepare_study` does every check that can fail on user input (strategies, device, model, data,
output directory) before anything is written. `run_study` then launches the trials not already
in the store (so re-running the same command resumes), and writes the reports from the store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import sqlite3
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainwise import strategies
from trainwise.config import IMAGE_TASK, StudyConfig, TrialSettings, TrialSpec
from trainwise.data.builtin import BUILTIN_DATASETS
from trainwise.data.sources import load_rows
from trainwise.errors import ConfigError
from trainwise.models import resolve_model, train_tokenizer
from trainwise.results import TrialResult


def resolve_device(device: str) -> tuple[str, set[str]]:
    """The device to run on and the capabilities it offers (see strategies.base.CAPABILITIES)."""
    import torch

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
    specs: list[TrialSpec]
    unsupported: dict[str, str]  # row spec -> reason, for rows the device cannot run
    rows: list[str]  # the row specs, in order


def _check_writable(out: Path) -> None:
    probe = out
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {probe} is not a writable directory")


def _fingerprint(train: list[dict], evals: list[dict]) -> str:
    h = hashlib.sha256()
    for row in [*train, {"split": "eval"}, *evals]:
        h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def prepare_study(cfg: StudyConfig) -> PreparedStudy:
    rows = strategies.parse_list(",".join(cfg.strategies))
    device, caps = resolve_device(cfg.device)
    unsupported: dict[str, str] = {}
    for spec in rows:
        missing = strategies.missing_capabilities(spec, caps)
        if not missing:
            continue
        reason = f"needs {', '.join(missing)}; this device ({device}) lacks it"
        if cfg.device != "auto":  # asked explicitly for a device that cannot run it: bad input
            raise ConfigError(f"strategy {spec!r} {reason}; drop it or use a device that supports it")
        unsupported[spec] = reason
    for spec in rows:
        for st in strategies.parse_spec(spec):
            if cfg.task not in st.tasks:
                raise ConfigError(
                    f"strategy {st.name!r} (in {spec!r}) applies to {', '.join(sorted(st.tasks))}, not {cfg.task}"
                )
    for spec in rows:
        missing_pkgs = strategies.missing_packages(spec)
        if missing_pkgs and spec not in unsupported:
            raise ConfigError(f"strategy {spec!r} needs {', '.join(missing_pkgs)}")
    _check_ranks(cfg, rows, device, unsupported)
    out = Path(cfg.out)
    _check_writable(out)
    if cfg.task == IMAGE_TASK:
        return _prepare_images(cfg, rows, device, unsupported, out)
    source = resolve_model(cfg.model, cfg.model_preset, cfg.task)
    if any(strategies.build_plan(r, cfg.accum_steps).lora_r for r in rows if r not in unsupported):
        _check_lora(source)

    dataset = cfg.dataset
    if dataset is None and cfg.train_file is None:
        dataset = "stdlib-topic" if cfg.task == "classification" else "stdlib-summarize"
    if dataset in BUILTIN_DATASETS and BUILTIN_DATASETS[dataset] != cfg.task:
        raise ConfigError(f"dataset {dataset!r} is a {BUILTIN_DATASETS[dataset]} dataset, not {cfg.task}")
    train, evals = load_rows(dataset, cfg.train_file, cfg.eval_file, cfg.text_column, cfg.target_column)
    # a fixed shuffle: files and corpora come grouped (the stdlib corpus by module), and eval and
    # --max-train-samples take prefixes
    random.Random(1234).shuffle(train)
    random.Random(4321).shuffle(evals)
    if cfg.max_train_samples:
        train = train[: cfg.max_train_samples]
    labels: list[str] = []
    if cfg.task == "classification":
        labels = sorted({r["target"] for r in train})
        if len(labels) < 2:
            raise ConfigError(f"classification needs at least 2 distinct targets, found {len(labels)}")
        if len(labels) > 1000:
            raise ConfigError(f"{len(labels)} distinct targets: is --target-column a class label?")
        evals = [r for r in evals if r["target"] in set(labels)]
    largest = max(b for b, _w in cfg.sweep())
    if len(train) < largest:
        raise ConfigError(f"the training data has {len(train)} rows, fewer than the batch size {largest}")

    # Everything the user gave is valid: from here on files are written.
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = _fingerprint(train, evals)
    _write_jsonl(data_dir / "train.jsonl", train)
    _write_jsonl(data_dir / "eval.jsonl", evals)
    (data_dir / "labels.json").write_text(json.dumps(labels))
    tokenizer_dir = None
    if source.kind == "preset":
        tok_path = out / "tokenizer"
        stamp = tok_path / "trainwise-data.txt"
        if not stamp.exists() or stamp.read_text() != f"{source.ref} {fingerprint}":
            train_tokenizer([t for r in train for t in (r["text"], r["target"])], source.ref, tok_path)
            stamp.write_text(f"{source.ref} {fingerprint}")
        tokenizer_dir = str(tok_path.resolve())

    settings = _settings(cfg, device, source, tokenizer_dir, data_dir, len(labels), len(train))
    return _specs(cfg, settings, fingerprint, unsupported, out, rows)


def _settings(cfg: StudyConfig, device: str, source, tokenizer_dir, data_dir: Path, n_labels: int, n_train: int):
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
    )


def _specs(cfg: StudyConfig, settings, fingerprint: str, unsupported: dict[str, str], out: Path, rows: list[str]):
    cells = [(row, b, w, cfg.label(row, b, w)) for row in rows for b, w in cfg.sweep()]
    specs = [
        TrialSpec(
            label,
            rep,
            strategies.build_plan(row, cfg.accum_steps),
            dataclasses.replace(settings, batch_size=b, num_workers=w),
            {"data": fingerprint},
        )
        for rep in range(cfg.repeat)  # repeats interleaved: drift on a shared machine hits every row alike
        for row, b, w, label in cells
    ]
    unsupported_cells = {label: unsupported[row] for row, _b, _w, label in cells if row in unsupported}
    return PreparedStudy(cfg, out, specs, unsupported_cells, [label for *_, label in cells])


def _prepare_images(cfg: StudyConfig, rows: list[str], device: str, unsupported: dict[str, str], out: Path):
    """image-classification: a project ResNeXt preset on digits, CIFAR-10 or image folders."""
    from trainwise.models import ModelSource
    from trainwise.vision import VISION_PRESETS, load_image_data, save_images

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
    largest = max(b for b, _w in cfg.sweep())
    if len(train) < largest:
        raise ConfigError(f"the training data has {len(train)} images, fewer than the batch size {largest}")
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    save_images(data_dir / "images.npz", train, evals)
    (data_dir / "labels.json").write_text(json.dumps(names))
    h = hashlib.sha256()
    for a in (train.x, train.y, evals.x, evals.y):
        h.update(np.ascontiguousarray(a).tobytes())
    source = ModelSource("preset", preset)
    settings = _settings(cfg, device, source, None, data_dir, len(names), len(train))
    return _specs(cfg, settings, h.hexdigest()[:16], unsupported, out, rows)


def _check_ranks(cfg: StudyConfig, rows: list[str], device: str, unsupported: dict[str, str]) -> None:
    """--nproc: enough devices, and every micro-batch splits evenly over the ranks."""
    if cfg.nproc > 1 and device == "cuda":
        import torch

        count = torch.cuda.device_count()
        if cfg.nproc > count:
            raise ConfigError(f"--nproc {cfg.nproc} needs {cfg.nproc} CUDA devices; this machine has {count}")
    for row in rows:
        if row in unsupported:
            continue
        plan = strategies.build_plan(row, cfg.accum_steps)
        for size in cfg.batch_sizes or (cfg.batch_size,):
            micro = size // plan.accum_steps
            if micro % cfg.nproc:
                raise ConfigError(
                    f"{row!r} at batch size {size}: each micro-batch of {micro} must split evenly over "
                    f"--nproc {cfg.nproc} ranks; use a batch size that is a multiple of {plan.accum_steps * cfg.nproc}"
                )


def _check_lora(source) -> None:
    from trainwise.models import PRESETS, _load_config
    from trainwise.trial import lora_targets

    model_type = PRESETS[source.ref][0] if source.kind == "preset" else _load_config(source).model_type
    if not lora_targets(model_type):
        raise ConfigError(
            f"lora: peft knows no attention modules to adapt in a {model_type!r} model; drop lora for this model"
        )


class Store:
    """The study's embedded SQLite store: one row per finished trial, written as it ends."""

    def __init__(self, path: Path):
        self.db = sqlite3.connect(path)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS trials (key TEXT PRIMARY KEY, strategy TEXT, repeat INTEGER, "
            "status TEXT, spec TEXT, result TEXT, finished_at REAL)"
        )
        self.db.commit()

    def get(self, key: str) -> TrialResult | None:
        row = self.db.execute("SELECT result FROM trials WHERE key = ?", (key,)).fetchone()
        return TrialResult.from_dict(json.loads(row[0])) if row else None

    def put(self, spec: TrialSpec, result: TrialResult) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO trials VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                spec.key(),
                spec.strategy,
                spec.repeat,
                result.status,
                json.dumps(spec.to_dict()),
                json.dumps(result.to_dict()),
                time.time(),
            ),
        )
        self.db.commit()

    def close(self) -> None:
        self.db.close()


Launch = Callable[[TrialSpec, Path, float, Callable[[dict], None]], TrialResult]
Events = Callable[[TrialSpec, dict], None]


def run_study(prepared: PreparedStudy, launch: Launch, on_event: Events, on_done: Callable) -> list[TrialResult]:
    """Run the trials not in the store yet; return every trial result of this study, in order."""
    cfg, out = prepared.config, prepared.out
    store = Store(out / "study.sqlite")
    results: list[TrialResult] = []
    try:
        for spec in prepared.specs:
            done = store.get(spec.key())
            if done is not None and (done.status == "ok" or not cfg.retry_failed):
                on_done(spec, done, True)
                results.append(done)
                continue
            if spec.strategy in prepared.unsupported:
                result = TrialResult(
                    spec.strategy, "unsupported", spec.repeat, prepared.unsupported[spec.strategy], spec.plan.to_dict()
                )
            else:
                trial_dir = out / "trials" / f"{spec.key()}"
                result = launch(spec, trial_dir, cfg.trial_timeout, _bind(on_event, spec))
            store.put(spec, result)
            on_done(spec, result, False)
            results.append(result)
    finally:
        store.close()
    return results


def _bind(on_event: Events, spec: TrialSpec) -> Callable[[dict], None]:
    return lambda event: on_event(spec, event)


NUMERIC = (
    "step_time_s",
    "step_time_p90_s",
    "data_wait_s",
    "compute_s",
    "optimizer_s",
    "warmup_s",
    "compile_s",
    "samples_per_s",
    "tokens_per_s",
    "padding_waste",
    "epoch_time_s",
    "peak_mem_bytes",
    "peak_reserved_bytes",
    "peak_rss_bytes",
    "state_bytes",
    "train_loss",
    "final_loss",
    "metric",
    "eval_s",
    "wall_s",
)


def is_baseline(label: str) -> bool:
    return label.split(" @")[0] == "baseline"


def aggregate(rows: list[str], results: list[TrialResult]) -> list[dict]:
    """One row per strategy: medians over its ok repeats, and time/memory relative to the baseline."""
    table = []
    for row in rows:
        trials = [r for r in results if r.strategy == row]
        ok = [r for r in trials if r.status == "ok"]
        first = (ok or trials)[-1]
        entry: dict = {
            "strategy": row,
            "status": first.status,
            "message": "" if ok else first.message,
            "repeats": len(ok),
            "mem_kind": first.mem_kind,
            "metric_name": first.metric_name,
            "plan": first.plan,
            "env": first.env,
            "world_size": first.world_size,
            "rank_peak_mem_bytes": first.rank_peak_mem_bytes,
            "trace": first.trace,
        }
        for name in NUMERIC:
            values = [getattr(r, name) for r in ok if getattr(r, name) is not None]
            entry[name] = statistics.median(values) if values else None
        if ok:
            entry["metrics"] = {
                k: statistics.median([r.metrics[k] for r in ok if k in r.metrics]) for k in ok[0].metrics
            }
            entry["step_time_s_all"] = [r.step_time_s for r in ok]
        table.append(entry)
    # the reference: the baseline row (with a sweep, the first baseline cell: smallest batch, fewest workers)
    base = next((e for e in table if is_baseline(e["strategy"]) and e["status"] == "ok"), None)
    for e in table:
        e["rel_time"] = e["rel_mem"] = None
        if base and e["status"] == "ok":
            e["rel_time"] = base["samples_per_s"] / e["samples_per_s"]
            if base["peak_mem_bytes"] and e["peak_mem_bytes"] is not None:
                e["rel_mem"] = e["peak_mem_bytes"] / base["peak_mem_bytes"]
    return table
