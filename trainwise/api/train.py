"""`trainwise train` as a call: one plan trained for real (periodic eval, best checkpoint, early stopping,
resumable), from the options or from a study's row (`plan_study`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainwise.api.options import TrainOptions
from trainwise.api.render import STDERR, Render
from trainwise.core.errors import ConfigError
from trainwise.run import launcher
from trainwise.run.events import Event, Warn
from trainwise.run.ranks import Rendezvous
from trainwise.training.tracking import parse_report_to


def start(options: TrainOptions, render: Render | None = STDERR):
    """Check and prepare, then train; returns the TrainResult (`train.summary` words it)."""

    render = Render.of(render)
    tc, backends = options.train_config(), parse_report_to(options.report_to)  # checked before torch loads
    if "LOCAL_RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ:
        raise ConfigError(
            "trainwise train starts its ranks itself: run it once per machine, not under torchrun (several machines: "
            "--nnodes N --node-rank R --master-addr A; under Slurm, srun --ntasks-per-node=1 trainwise train ...)"
        )
    # where the ranks meet over several machines (the options, else Slurm's and torchrun's environment), or None
    meet = Rendezvous.resolve(options.nnodes, options.node_rank, options.master_addr, options.master_port)
    if meet is not None:
        plan = options.strategies or "baseline"
        meet.check_batch(options.batch_size, options.ranks_here(), plan, options.accum_steps, options.task)
    if meet is not None and options.plan_study is not None:
        raise ConfigError("--plan trains a study's row on one machine; over several, give the plan with --strategies")
    options.price()  # a bad price is said now, not after the run (the summary prices it)
    if options.plan_study is not None:
        from trainwise.api.stored import study_spec  # heavy: trainwise.api.stored loads numpy

        taken = ("model", "model_preset", "dataset", "train_file", "eval_file", "lr")
        given = [f"--{k.replace('_', '-')}" for k in taken if getattr(options, k)]
        if given:
            raise ConfigError(f"--plan takes the model, data and settings from the study: leave out {', '.join(given)}")
        spec = study_spec(Path(options.plan_study), options.strategies, render.note, Path(options.out), options.force)
    else:
        from trainwise.study.prepare import prepare_study  # heavy: trainwise.study.prepare loads numpy

        cfg = options.plan_config()
        # ranks fork from the zygote: its imports overlap the preparation (one machine's ranks only)
        if cfg.nproc > 1 and meet is None:
            launcher.warm()
        with render.status("trainwise train: validating input, preparing data and model..."):
            prepared = prepare_study(cfg, render.note)
        if prepared.unsupported:
            raise ConfigError(f"{cfg.rows[0].text!r}: {next(iter(prepared.unsupported.values()))}")
        spec = prepared.specs[0]
        if (verdict := prepared.verdicts.get(spec.row)) is not None and verdict.status != "native":
            render.note(f"trainwise: note: {verdict.line()}")  # trained as asked; why it may be slow
    from trainwise.training.fit import TrainJob, train_any  # torch: after every check of the input

    def on_event(event: Event) -> None:
        if isinstance(event, Warn):
            render.note(f"trainwise: warning: {event.text}")
        else:
            render.event(event)

    return train_any(TrainJob(spec, tc, Path(options.out), options.resume, backends, meet), on_event)


def train(config: str | Path | None = None, render: Render | None = STDERR, **options: Any):
    """`trainwise train` in Python: the CLI's options as keyword arguments (over a study file's). Returns
    the TrainResult (steps, best metric, the model directory)."""
    return start(TrainOptions.of(options, config), render)
