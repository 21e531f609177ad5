"""The commands a verb hands back: `trainwise train` of a tune's best trial."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainwise.core.config import DataOrigin, TrialSettings, TrialSpec
from trainwise.exporting.scripts import RunSettings, epochs_for, named_model, train_command, train_out
from trainwise.search.hyperparams import TuneConfig, shown
from trainwise.search.space import TuneResult, apply


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
