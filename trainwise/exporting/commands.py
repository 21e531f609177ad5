"""The commands a verb hands back: `trainwise train` of a plan (train_command.txt), and of a tune's best trial."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from trainwise import strategies
from trainwise.core.config import TrialSettings
from trainwise.exporting.arguments import RunSettings, epochs_for, named_model
from trainwise.search.hyperparams import TuneConfig, shown
from trainwise.search.space import TuneResult, apply
from trainwise.spec.config import TrialSpec
from trainwise.study.origin import DataOrigin


def train_out(beside: Path | str, name: str) -> str:
    """Where a written `trainwise train` command puts its run: a folder `train-NAME` beside `beside` (the
    export or tune directory), so its checkpoints land where the user already looks, not in a default."""
    return str(Path(beside).parent / f"train-{name}")


def reads_accum_steps(row: str) -> bool:
    """Whether the row's plan depends on --accum-steps (a `grad_accum` written without =N, or an alias holding one)."""
    return strategies.parse_row(row, 2).plan != strategies.parse_row(row, 3).plan


def train_command(s: RunSettings, out: str | None = None) -> str:
    """The `trainwise train` command that trains this plan on the same model, data and settings, into `out`
    (default: runs/train-ROW). Only what the plan reads: --accum-steps only for a row whose plan depends on it."""
    model_flag = ["--model-preset", s.model] if s.model_is_preset else ["--model", s.model]
    argv = [
        "trainwise",
        "train",
        "--strategies",
        s.row,
        *model_flag,
        "--task",
        s.task,
        *(s.origin.flags() if s.origin is not None else []),
        "--batch-size",
        str(s.batch_size),
        *(["--accum-steps", str(s.accum_steps)] if reads_accum_steps(s.row) else []),
        "--max-length",
        str(s.max_length),
        *(["--max-target-length", str(s.max_target_length)] if s.task == "seq2seq" else []),
        *(["--truncation", s.truncation] if s.truncation else []),
        "--lr",
        str(s.lr),
        "--epochs",
        str(s.epochs),
        "--max-steps",
        str(s.max_steps),
        "--seed",
        str(s.seed),
        *(["--nproc", str(s.nproc)] if s.nproc > 1 else []),
        *(["--num-workers", str(s.num_workers)] if s.num_workers else []),
        "--out",
        out or train_out("runs/export", s.row),
    ]
    return shlex.join(argv)


def best_train_command(
    spec: TrialSpec, result: TuneResult, cfg: TuneConfig, origin: DataOrigin | None, out: Path
) -> tuple[str, str | None] | None:
    """The `trainwise train` command that trains the best trial's settings (its values on the tune's model,
    data and plan, for the trial's --max-steps, into a run folder beside --out), and a note naming the
    tuned values `train` has no option for (it trains those at their defaults). None: no trial finished."""

    if not result.best_params:
        return None
    best = apply(spec, result.best_params)
    s = best.settings
    model, preset = named_model(s)
    run = RunSettings(
        model, s.task, s.batch_size, s.max_length, s.max_target_length, s.lr, cfg.max_steps, seed=s.seed,
        model_is_preset=preset, row=spec.row, accum_steps=s.accum_steps, origin=origin,
        epochs=epochs_for(best, cfg.max_steps),
    )  # fmt: skip
    defaults = {f.name: f.default for f in dataclasses.fields(TrialSettings)}
    untold = {k: v for k, v in result.best_params.items() if k not in ("lr", "batch_size")}
    notes = []
    if untold:
        trained = ", ".join(f"{k}={defaults[k]}" for k in untold)
        notes.append(f"train has no option for {shown(untold)}: this command trains {trained} (the defaults)")
    if cfg.search == "pbt":
        notes.append(
            "PBT's best values are the last of a schedule its member followed on weights it inherited; "
            "trained from scratch with them, a run is not the one measured"
        )
    return train_command(run, train_out(out, f"{out.name}-best")), "; ".join(notes) or None
