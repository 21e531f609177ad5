"""trainwise train: a full fine-tuning run, on the loop `compare` measures (`trainwise.training.loop`).

Around the loop's steps: periodic evaluation, best-checkpoint tracking, early stopping, and checkpoints that survive a
SIGKILL (trainwise.training.checkpoint: written whole or not at all, verified on `--resume`, which falls back to the
previous good one if the last is damaged, and says so, and refuses a checkpoint of another model, plan or data).
Population-based training (`trainwise tune --search pbt`) starts a member from another member's checkpoint with new
hyper-parameters (`adopt`): the same model, plan, data and batch, with its own learning rate, weight decay and label
smoothing from then on. `best/` and `final/` are the models users take away: for text tasks Hugging Face model
directories (config with the data's label names, weights, tokenizer) that `from_pretrained` and `pipeline` load.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors.torch import save_file, save_model

from trainwise import strategies
from trainwise.core.config import TrainConfig, maximize, monitored
from trainwise.core.errors import ConfigError, RunFailed
from trainwise.core.files import (
    failed,
    free_space,
    hold,
    human_bytes,
    plain_modes,
    refused_by,
    tree_bytes,
    write_atomic,
    writing,
)
from trainwise.core.results import TrainResult
from trainwise.run.events import Checkpoint, Emit, Eval, Event, Note, Step, Warn, ignore
from trainwise.run.faults import seamed
from trainwise.run.launcher import Exit, Listener, Place, run
from trainwise.run.ranks import Ranks, Rendezvous, is_multiprocess, several_nodes
from trainwise.spec.config import StudyConfig, TrialSpec
from trainwise.training import loop
from trainwise.training.checkpoint import (
    RESUME_HINT,
    TrainState,
    check_shared,
    find_resumable,
    load_checkpoint,
    prune,
    save_checkpoint,
    verify,
)
from trainwise.training.data.prepared import TrialData, load_data
from trainwise.training.tracking import Tracker


@dataclass
class EarlyStopping:
    """Stop after `patience` evaluations that do not improve on the best by more than `min_delta`."""

    patience: int | None
    min_delta: float
    higher_is_better: bool
    best: float | None = None
    best_step: int = 0
    bad: int = 0

    def update(self, value: float, step: int) -> tuple[bool, bool]:
        """Record one evaluation; returns (is a new best, stop now)."""
        better = self.best is None or (
            value > self.best + self.min_delta if self.higher_is_better else value < self.best - self.min_delta
        )
        if better:
            self.best, self.best_step, self.bad = value, step, 0
        else:
            self.bad += 1
        return better, self.patience is not None and self.bad >= self.patience


@dataclass(frozen=True)
class TrainJob:
    """One training run: what to train (the spec: model, data, plan, settings), for how long and with what
    evaluation and checkpoints (tc), where (out), whether to continue the checkpoints there (resume) and
    which trackers get its curves (report_to). Its listener is `run`'s: step, eval, checkpoint, note and
    warning events."""

    spec: TrialSpec
    tc: TrainConfig
    out: Path
    resume: bool = False
    report_to: tuple[str, ...] = ()
    rendezvous: Rendezvous | None = None  # several machines: this node's place in the group (--nnodes ...)

    def place(self) -> Place:
        """Over the ranks its plan needs (data parallel, ZeRO); the ranks' stderr in ranks.log (with several
        nodes: this node's, ranks.nodeR.log)."""
        s, meet = self.spec.settings, self.rendezvous
        log = "ranks.log" if meet is None else f"ranks.node{meet.node_rank}.log"
        job = "ranks.json" if meet is None else f"ranks.node{meet.node_rank}.json"
        return Place(self.out / job, self.out / log, s.nproc, s.device, meet)

    def to_dict(self) -> dict:
        return {
            "spec": self.spec.to_dict(),
            "tc": asdict(self.tc),
            "out": str(self.out),
            "resume": self.resume,
            "report_to": list(self.report_to),
            "rendezvous": None if self.rendezvous is None else self.rendezvous.to_dict(),
        }

    @classmethod
    def from_dict(cls, blob: dict) -> TrainJob:
        spec, tc, out = TrialSpec.from_dict(blob["spec"]), TrainConfig(**blob["tc"]), Path(blob["out"])
        meet = Rendezvous.from_dict(blob.get("rendezvous"))
        return cls(spec, tc, out, bool(blob["resume"]), tuple(blob["report_to"]), meet)

    def run(self, emit: Emit) -> TrainResult:
        """Train in this process (a rank: rank 0 reports to the trackers). The test seam
        TRAINWISE_FAULT="train:KIND@STEP" acts here, in every rank."""
        job = self if Ranks.from_env().main else dataclasses.replace(self, report_to=())
        return run_train(job, seamed(emit, "train", self.spec.settings.batch_size))

    def ended(self, results: list[TrainResult | None], end: Exit) -> TrainResult:
        """Rank 0's result (it wrote train_result.json; on another node, that node's first rank's); a run whose
        ranks failed raises, in one line."""
        if end.code != 0 or results[0] is None:
            if reason := refused_by(end.tail, self.out, died=True):
                raise failed(self.out, reason, RESUME_HINT)
            nproc = self.spec.settings.nproc
            where = "" if self.rendezvous is None else f" of node {self.rendezvous.node_rank}"
            raise RunFailed(
                f"the {nproc} training ranks{where} exited with code {end.code}: {end.tail[:300]} (log: {end.log})"
            )
        return results[0]


def disk_use(out: Path) -> dict[str, int]:
    """What a run keeps under `out`, in bytes (a file linked from two places counted once)."""
    parts = {name: tree_bytes(out / name) for name in ("checkpoints", "best", "final")}
    return {**parts, "total": tree_bytes(out), "checkpoint_count": len(list((out / "checkpoints").glob("ckpt-*")))}


def link_tree(src: Path, dest: Path) -> None:
    """`dest` made a copy of `src` whose files are hard links (no second copy on disk; a copy where the
    file system has no links), built aside and swapped in like save_model_dir."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with writing(dest, tmp, hint=RESUME_HINT):
        shutil.copytree(src, tmp, copy_function=_link_or_copy)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _link_or_copy(src: str, dest: str) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def fingerprint(spec: TrialSpec, with_lr: bool = True) -> str:
    """What must match for a checkpoint to be resumed: model, plan, data and the loop's settings.

    Without the learning rate, it is what must match for PBT to continue a checkpoint with new
    hyper-parameters: the sampler position and the tensors' shapes depend on everything else."""
    s = spec.settings
    key = {
        "plan": spec.plan.to_dict(),
        "model": [s.model_kind, s.model_ref],
        "task": s.task,
        "data": spec.extra.get("data"),
        "batch": [s.batch_size, s.max_length, s.max_target_length, s.seed] + ([s.lr] if with_lr else []),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def set_hyper(optimizer, scheduler, lr: float, weight_decay: float) -> None:
    """Give a loaded optimizer and schedule a new peak learning rate and weight decay (PBT's explore).

    The schedule keeps its position and shape: the lr becomes the new peak times the schedule's
    factor at the current step."""
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate wraps the torch scheduler
    inner.base_lrs = [lr for _ in inner.base_lrs]
    for group, factor in zip(optimizer.param_groups, inner.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(inner.last_epoch)
        group["weight_decay"] = weight_decay
    inner._last_lr = [g["lr"] for g in optimizer.param_groups]


# ---- the run ------------------------------------------------------------------------------------


def run_train(job: TrainJob, emit: Emit = ignore, adopt: Path | None = None) -> TrainResult:
    """Train in this process; `emit` gets step, eval, checkpoint and warning events, and the trackers of
    `job.report_to` (--report-to) the run's curves. `adopt`: start from this checkpoint (of another run of
    the same model, plan, data and batch) with this spec's hyper-parameters (PBT)."""
    if not job.report_to:
        return _fit(job, emit, adopt)

    spec, tc, out = job.spec, job.tc, job.out
    params = {"plan": spec.row, **dataclasses.asdict(spec.settings), **dataclasses.asdict(tc)}
    out.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(job.report_to, out, f"{out.name} {spec.row}", params, job.resume, lambda t: emit(Warn(t)))

    def on_event(event: Event) -> None:
        tracker.log(event)
        emit(event)

    try:
        r = _fit(job, on_event, adopt)
    except BaseException:
        tracker.close(failed=True)
        raise
    keep = ("steps", "planned_steps", "final_loss", "best_step", "best_value", "wall_s", "compute_saved")
    tracker.close({k: getattr(r, k) for k in keep})
    return r


def _fit(job: TrainJob, emit: Emit, adopt: Path | None) -> TrainResult:
    """The run itself: the loop, with evaluation, checkpoints and early stopping around its steps."""
    spec, tc, out, resume = job.spec, job.tc, job.out, job.resume

    def warn(text: str) -> None:
        emit(Warn(text))

    s = spec.settings
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    data = load_data(spec)
    per_epoch = loop.steps_per_epoch(spec, len(data.lengths))
    if per_epoch == 0:
        raise ConfigError(f"an epoch of {len(data.lengths)} samples has no full batch of {s.batch_size}")
    planned = tc.epochs * per_epoch if tc.max_steps is None else min(tc.max_steps, tc.epochs * per_epoch)
    spec = dataclasses.replace(spec, steps=planned)
    parts = loop.build(spec, data, planned)
    raw = parts.raw_model
    ranks = Ranks.from_env()
    engine = parts.model if parts.rt.deepspeed is not None else None  # DeepSpeed's engine: ZeRO checkpoints

    if several_nodes() and tc.checkpoints:
        check_shared(out)
    root = out / "checkpoints"
    state = TrainState(fingerprint=fingerprint(spec), base=fingerprint(spec, with_lr=False))
    higher = maximize(tc.monitor)
    stopper = EarlyStopping(tc.patience, tc.min_delta, higher)
    resumed_from = None
    if adopt is not None:
        problem = verify(adopt)
        if problem is not None:
            raise ConfigError(f"checkpoint {adopt} is damaged ({problem})")
        saved = json.loads((adopt / "extra.json").read_text())["trainer"].get("base")
        if saved != state.base:
            raise ConfigError(f"{adopt} was written by a run with another model, plan, data or batch settings")
        own = state
        state = load_checkpoint(adopt, raw, parts.optimizer, parts.scheduler, engine)
        state.fingerprint, state.base = own.fingerprint, own.base  # checkpoints from here on are this run's
        set_hyper(parts.optimizer, parts.scheduler, s.lr, s.weight_decay)
        stopper = EarlyStopping(tc.patience, tc.min_delta, higher, **state.stopper)
        resumed_from = str(adopt)
    elif resume:
        ckpt = find_resumable(root, warn)
        if ckpt is None:
            damaged = sorted(p.name for p in root.glob("ckpt-*")) if root.is_dir() else []
            what = f"no whole checkpoint (damaged: {', '.join(damaged)})" if damaged else "no checkpoint"
            warn(f"--resume: {what} in {root}; starting from step 0")
        else:
            saved = json.loads((ckpt / "extra.json").read_text())["trainer"]["fingerprint"]
            if saved != state.fingerprint:
                raise ConfigError(
                    f"--resume: {ckpt} was written by a run with another model, plan, data or batch settings "
                    f"(fingerprint {saved} != {state.fingerprint}); use another --out or the original options"
                )
            state = load_checkpoint(ckpt, raw, parts.optimizer, parts.scheduler, engine)
            stopper = EarlyStopping(tc.patience, tc.min_delta, higher, **state.stopper)
            resumed_from = ckpt.name
    elif root.exists() and any(root.glob("ckpt-*")):
        raise ConfigError(f"{out} already holds checkpoints: add --resume to continue it, or use another --out")

    parts.step = state.step
    stream = loop.Stream(data, parts, position=state.micro)  # from the sampler position on
    stopped = False

    def on_step(loss: float, micro: list) -> bool:
        nonlocal stopped
        state.step, state.micro = parts.step, stream.position
        state.losses.append(loss)
        samples = sum(b.n_samples for b in micro) * parts.world  # this rank's share, times the ranks
        emit(Step(state.step, planned, loss, lr=parts.lr, samples=samples))
        if state.step % tc.eval_every == 0 or state.step == planned:
            window = state.losses[-tc.eval_every :]
            record = {"step": state.step, "train_loss": sum(window) / len(window)}
            if data.n_eval:
                record.update(data.evaluate(parts.model, parts.accelerator))
            value = monitored(record, tc.monitor)
            if value is not None:
                best, stopped = stopper.update(float(value), state.step)
                record["best"] = best
                if best and tc.checkpoints:
                    save_model_dir(out / "best", parts, data, record)
            state.evals.append(record)
            emit(Eval(state.step, {k: v for k, v in record.items() if k != "step"}))
        if tc.checkpoints and (state.step % tc.save_every == 0 or state.step == planned or stopped):
            state.stopper = {"best": stopper.best, "best_step": stopper.best_step, "bad": stopper.bad}
            saved_at = save_checkpoint(root, raw, parts.optimizer, parts.scheduler, state, engine)
            emit(Checkpoint(state.step, str(saved_at)))
            if ranks.main:
                prune(root, tc.keep_checkpoints, protect={saved_at.name})
        return stopped

    loop.run(parts, stream, planned, on_step)
    if tc.checkpoints:
        final = {"step": state.step, "train_loss": state.losses[-1] if state.losses else None}
        best = out / "best" / "eval.json"
        if ranks.main and stopper.best_step == state.step and best.is_file() and parts.rt.deepspeed is None:
            link_tree(out / "best", out / "final")  # the same weights: final/ shares best/'s files
        else:
            save_model_dir(out / "final", parts, data, state.evals[-1] if state.evals else final)
    result = TrainResult(
        steps=state.step,
        planned_steps=planned,
        stopped_early=stopped and state.step < planned,
        final_loss=state.losses[-1] if state.losses else float("nan"),
        best_step=stopper.best_step,
        best_value=stopper.best,
        monitor=tc.monitor,
        evals=state.evals,
        resumed_from=resumed_from,
        wall_s=time.perf_counter() - t0,
        out=str(out),
    )
    if ranks.main:
        result.disk = disk_use(out)
        write_atomic(out / "train_result.json", json.dumps(result.to_dict()))
    return result


def save_model_dir(dest: Path, parts: loop.Parts, data: TrialData, record: dict) -> None:
    """Write the model where users load it (`best/`, `final/`): for text tasks a Hugging Face model
    directory (config with the data's label names, safetensors weights, tokenizer); for images the
    weights. LoRA adapters are merged into a copy, so the directory needs no peft. ZeRO-3's partitioned
    weights are gathered first (every rank calls this); rank 0 writes. The directory is built aside and
    swapped in, so a kill leaves the previous one whole."""

    model = getattr(parts.raw_model, "_orig_mod", parts.raw_model)  # torch.compile's wrapper
    main = Ranks.from_env().main
    state_dict = None
    if (parts.rt.deepspeed or {}).get("zero_optimization", {}).get("stage") == 3:
        import deepspeed  # optional: trainwise[deepspeed]

        # every rank takes part in gathering the partitioned weights; rank 0 keeps a whole copy
        with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            if main:
                state_dict = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if not main:
        return
    if hasattr(model, "merge_and_unload"):  # a peft model
        model = copy.deepcopy(model).merge_and_unload()
    tmp, old = dest.with_name(dest.name + ".tmp"), dest.with_name(dest.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    with writing(dest, tmp, hint=RESUME_HINT):
        _write_model_dir(tmp, model, data, state_dict, record)
        plain_modes(tmp)  # the weights as readable as the config beside them
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def _write_model_dir(tmp: Path, model, data: TrialData, state_dict: dict | None, record: dict) -> None:

    tmp.mkdir(parents=True)
    if data.save is not None:
        data.save(model, tmp, state_dict)
    elif state_dict is not None:
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(tmp / "model.safetensors"))
    else:
        save_model(model, str(tmp / "model.safetensors"))
    (tmp / "eval.json").write_text(json.dumps(record))


# ---- the verb ------------------------------------------------------------------------------------


def check_one_process(cfg: StudyConfig, verb: str) -> None:
    """tune runs each trial as one process: data parallelism and ZeRO are compare's and train's (`--nproc`)."""
    row = cfg.rows[0]
    if row.batch_size:
        raise ConfigError(
            f"{row.text!r}: {verb} trains at --batch-size (or its search space's batch_size); leave out "
            f"@bs{row.batch_size}"
        )
    if cfg.nproc > 1 or strategies.runtime(row.plan, cfg.task, "cpu").needs_ranks:
        raise ConfigError(
            f"{row.text!r} needs {max(2, cfg.nproc)} ranks (data parallel / ZeRO); {verb} runs one process: "
            "measure it with `trainwise compare --nproc N`, train it with `trainwise train --nproc N`"
        )


def train_ranks(job: TrainJob, on_event: Listener) -> TrainResult:
    """`run_train` over the ranks a plan needs (data parallel, ZeRO): each rank runs `job.run` as `compare
    --nproc` runs its trials; rank 0's events come back, and its result. Checkpoints are written by every rank
    together, so `--resume` continues a run that was killed."""
    job.out.mkdir(parents=True, exist_ok=True)
    (job.out / "train_result.json").unlink(missing_ok=True)
    return run(job, on_event)


def train_any(job: TrainJob, on_event: Listener = ignore) -> TrainResult:
    """Train in this process, or over the ranks the plan needs (data parallel, ZeRO) under torchrun; one
    command at a time in `job.out` (and the folder is marked trainwise's). `on_event` hears the run's
    notes, steps, evaluations, checkpoints and warnings."""

    spec, out, meet = job.spec, job.out, job.rendezvous
    # several nodes share --out (their checkpoints need it): each node's command holds a lock of its own there
    with hold(out, None if meet is None or meet.node_rank == 0 else f"node{meet.node_rank}"):
        if meet is not None:
            nodes = f"node {meet.node_rank} of {meet.nnodes} (rendezvous {meet.master_addr}:{meet.master_port})"
            on_event(Note(f"{nodes}: {spec.settings.nproc} rank(s) here, their output in {job.place().log}"))
            if meet.node_rank > 0:
                on_event(Note("rank 0 (node 0) reports the run's progress, evaluations and result"))
                return run(job, on_event)
        on_event(Note(writes_line(out, job.tc)))
        if is_multiprocess(spec) or meet is not None:
            on_event(Note(f"{spec.row!r} over {spec.settings.nproc} ranks (their output: {job.place().log})"))
            return train_ranks(job, on_event)
        return run(job, on_event, backend="here")


def writes_line(out: Path, tc: TrainConfig) -> str:
    """Where a run writes and what it keeps, said before it starts."""
    if not tc.checkpoints:
        return f"writing to {out} (no checkpoints)"
    return (
        f"writing to {out.resolve()}: a checkpoint (model + optimizer state) every {tc.save_every} steps, the last "
        f"{tc.keep_checkpoints} kept (--keep-checkpoints), and best/ and final/ model directories "
        f"({human_bytes(free_space(out))} free there)"
    )


def disk_line(r: TrainResult, tc: TrainConfig) -> str:
    """What the run left on disk, by part."""
    d = r.disk
    n = d.get("checkpoint_count", 0)
    shared = (
        " (final/ shares best/'s files)"
        if d.get("final") and d.get("best") and d["total"] < sum(d.get(k, 0) for k in ("checkpoints", "best", "final"))
        else ""
    )
    return (
        f"disk: {human_bytes(d['total'])} in {r.out}: checkpoints/ {human_bytes(d.get('checkpoints'))} "
        f"({n} kept, --keep-checkpoints {tc.keep_checkpoints}), best/ {human_bytes(d.get('best'))}, "
        f"final/ {human_bytes(d.get('final'))}{shared}"
    )


def summary(r: TrainResult, tc: TrainConfig, price) -> list[str]:
    """What `trainwise train` prints when the run ends."""
    lines = [
        f"trained {r.steps}/{r.planned_steps} steps in {r.wall_s:.0f} s"
        + (f" (resumed from {r.resumed_from})" if r.resumed_from else ""),
        f"final train loss {r.final_loss:.4f}",
    ]
    if r.best_value is not None:
        lines.append(f"best {r.monitor} {r.best_value:.4f} at step {r.best_step} (model in {r.out}/best/)")
    if tc.checkpoints:
        lines.append(f"final model in {r.out}/final/ (a Hugging Face model directory for text tasks)")
    if r.disk:
        lines.append(disk_line(r, tc))
    if r.stopped_early:
        lines.append(
            f"early stop: no improvement > {tc.min_delta:g} in {tc.patience} evaluations; "
            f"{100 * r.compute_saved:.0f}% of the planned steps not spent"
        )
    if price is not None:
        # the checkpoint interval of this run, in time: save_every steps at the measured pace
        per_step = r.wall_s / max(1, r.steps)
        price = dataclasses.replace(price, checkpoint_hours=tc.save_every * per_step / 3600)
        rework = f" (x{price.rework_factor():.3f} expected re-work)" if price.low_priority else ""
        lines.append(f"cost ${price.cost(r.wall_s):.4g} at {price.label}{rework}")
    return lines
