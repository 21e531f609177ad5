"""A study's run: the trials not in the store yet, one process each, stored as each ends (so the same command
resumes), re-measured when the machine was busy, and the study's projected time as it goes."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainwise.core.errors import ConfigError, RunFailed
from trainwise.core.files import failed, hold, refused_by
from trainwise.core.results import TrialResult, combine_ranks
from trainwise.run import cluster
from trainwise.run.events import Event, Note
from trainwise.run.ranks import Rendezvous, is_multiprocess
from trainwise.spec.config import StudyConfig, TrialSpec
from trainwise.strategies import Support
from trainwise.strategies.precision import COMPILE
from trainwise.study import projection
from trainwise.study.prepare import PreparedStudy
from trainwise.study.store import STORE, Store, Trials, still_there
from trainwise.training.measure import contention

Launch = Callable[[TrialSpec, Path, float, Callable[[Event], None]], TrialResult]
Events = Callable[[TrialSpec, Event], None]


def run_study(
    prepared: PreparedStudy,
    launch: Launch,
    on_event: Events,
    on_done: Callable,
    on_stored: Callable[[Trials], object] | None = None,
) -> Trials:
    """Run the trials not in the store yet; return every trial of this study with its result, in order.
    `on_stored` gets the trials so far each time one is stored (the reports are rewritten with it)."""
    if prepared.config.max_steps is None:  # a training run's study (train, tune): its schedule says the steps
        raise ConfigError("a study's trials need --max-steps: this one was prepared for a training run")
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


def unstored(prepared: PreparedStudy) -> list[TrialSpec]:
    """The trials a run of `prepared` would launch now: those no stored result stands for."""
    store = Store(prepared.out / STORE)
    try:
        return [s for s in prepared.specs if _stored(store, s, prepared) is None]
    finally:
        store.close()


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
    shape = projection.Shape(rows, per_row, extra, prepared.specs[0].steps or 0, cfg.warmup_steps, frozenset(slow))
    return projection.Clock(shape, to_run)


def _run_trials(prepared: PreparedStudy, launch: Launch, on_event: Events, on_done: Callable, on_stored) -> Trials:
    cfg, out = prepared.config, prepared.out
    store = Store(out / STORE)
    trials: Trials = []
    try:
        if cfg.ray_address is not None:
            return _on_cluster(prepared, store, on_event, on_done, on_stored)
        clock = _clock(prepared, store)
        for spec in prepared.specs:
            if (done := _stored(store, spec, prepared)) is not None:
                on_done(spec, done, True)
                trials.append((spec, done))
                continue
            result = _without_training(spec, prepared)
            if result is None:
                trial_dir = out / "trials" / f"{spec.key()}"
                still_there(out)
                clock.started(spec.row)
                result = _measured(spec, trial_dir, launch, Retry.of(cfg), _timed(on_event, spec, clock))
                refused(result, trial_dir)  # a full disk is not a measurement of the strategy: not stored
                still_there(out)
                if (said := clock.ended()) is not None:
                    on_event(spec, said)
            _put(store, spec, result, prepared, on_done)
            trials.append((spec, result))
            if on_stored is not None:
                on_stored(trials)
    finally:
        store.close()
    return trials


def _without_training(spec: TrialSpec, prepared: PreparedStudy) -> TrialResult | None:
    """The row of a trial that is not trained (an unsupported plan, a recorded one); None when it runs."""
    if spec.row in prepared.unsupported:
        return TrialResult(spec.row, "unsupported", spec.repeat, prepared.unsupported[spec.row], spec.plan.to_dict())
    if spec.row in prepared.recorded:
        return _recorded(spec, prepared.recorded[spec.row])
    return None


def _put(store: Store, spec: TrialSpec, result: TrialResult, prepared: PreparedStudy, on_done) -> None:
    verdict = prepared.verdicts.get(spec.row)
    result.support_note = prepared.row_notes.get(spec.row) or (
        verdict.line() if verdict and verdict.status != "native" else ""
    )
    result.precision_ratio = verdict.ratio if verdict else None
    store.put(spec, result)
    on_done(spec, result, False)


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


@dataclass(frozen=True)
class Retry:
    """How a trial is run and run again: its timeout, and re-runs while the machine was loaded (0: none)."""

    trial_timeout: float
    retries: int = 0
    quiet_wait_s: float = 0.0

    @classmethod
    def of(cls, cfg: StudyConfig) -> Retry:
        return cls(cfg.trial_timeout, cfg.retries, cfg.quiet_wait_s)


# what a row that compiles (torch.compile) is allowed beyond --trial-timeout: its compile is a one-time cost the
# plan charges once against the planned run (SmolLM2-135M's took about 80 s on an H200), not a reason to time out
COMPILE_ALLOWANCE_S = 600.0


def timeout_for(spec: TrialSpec, timeout_s: float) -> float:
    """The trial's timeout: --trial-timeout, plus COMPILE_ALLOWANCE_S for a row that compiles."""
    return timeout_s + (COMPILE_ALLOWANCE_S if spec.plan[COMPILE] else 0.0)


def _measured(spec: TrialSpec, trial_dir: Path, launch: Launch, cfg: Retry, emit: Callable) -> TrialResult:
    """The trial, run again (up to cfg.retries times, once the machine is quiet) while other processes
    took a large share of the CPUs during its timed steps: the row keeps the clean run and counts the
    runs it discarded; when no clean run could be had, the last one stays flagged `contended`."""
    result = launch(spec, trial_dir, timeout_for(spec, cfg.trial_timeout), emit)
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
        again = launch(spec, trial_dir, timeout_for(spec, cfg.trial_timeout), emit)
        if not quiet and again.status == "ok" and not again.contended:
            # the machine was busy when it started: a window too short to judge (contended None), or one the
            # others' load happened to miss, does not make it clean (a search would chase its noise)
            again.contended = True
            emit(Note("measured while the machine was known to be busy: the row stays flagged (loaded)"))
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


# ---- on a Ray cluster (--ray-address) ---------------------------------------------------------------

LOG_TAIL = 64 * 1024  # of a trial's log on its node, what comes back to its trial directory here


def _on_cluster(prepared: PreparedStudy, store: Store, on_event: Events, on_done: Callable, on_stored) -> Trials:
    """The trials not stored yet as Ray tasks over the cluster's nodes, as many at once as it has free slots, each
    stored here as it arrives (so the same command resumes). With nodes of several device kinds the baseline runs on
    each kind, and the table compares a row only with the baseline of its kind (`aggregate`)."""
    cfg, out = prepared.config, prepared.out
    first = prepared.specs[0]
    pool = _pool(cfg.ray_address, first)
    try:
        on_event(first, Note(_cluster_line(pool)))
        # the kinds that can run a trial (with --nodes-per-trial: those with enough nodes for a group)
        specs = per_kind(prepared.specs, prepared, list(dict.fromkeys(s.node.kind for s in pool.slots)))
        results: dict[int, TrialResult] = {}

        def so_far() -> Trials:
            return [(spec, results[i]) for i, spec in enumerate(specs) if i in results]

        todo = []
        for i, spec in enumerate(specs):
            if (done := _stored(store, spec, prepared)) is not None:
                on_done(spec, done, True)
                results[i] = done
            elif (row := _without_training(spec, prepared)) is not None:
                _put(store, spec, row, prepared, on_done)
                results[i] = row
            else:
                todo.append(i)
        if not todo:
            return so_far()
        files, retry = cluster.study_files(pool.ray, first), Retry.of(cfg)

        def start(i: int, slot: cluster.Slot) -> None:
            on_event(specs[i], Note(_placed(specs[i], slot)))

        def end(i: int, slot: cluster.Slot, value: dict | cluster.Lost) -> None:
            spec = specs[i]
            result = _arrived(spec, slot, value, out / "trials" / spec.key(), lambda e: on_event(spec, e))
            _put(store, spec, result, prepared, on_done)
            results[i] = result
            if on_stored is not None:
                on_stored(so_far())

        args = lambda i, slot, meet: (specs[i].to_dict(), retry, files, meet)  # noqa: E731
        kind = lambda i: specs[i].extra.get(cluster.KIND)  # noqa: E731
        stranded = pool.run(todo, _on_node, args, start, end, kind, _failed)
        if stranded:
            _no_node_left([specs[i] for i in stranded])
        return so_far()
    finally:
        pool.close()


def _pool(address: str | None, spec: TrialSpec) -> cluster.Pool:
    s = spec.settings
    return cluster.Pool(address, s.device, s.nproc if is_multiprocess(spec) else 1, span=s.nnodes)


def _placed(spec: TrialSpec, slot: cluster.Slot) -> str:
    if slot.peers:
        return f"{spec.row} (repeat {spec.repeat}): on nodes {', '.join(n.ip for n in slot.nodes)} ({slot.node.kind})"
    return f"{spec.row} (repeat {spec.repeat}): on node {slot.node.label()}"


def _no_node_left(specs: list[TrialSpec]) -> None:
    kinds = sorted({s.extra.get(cluster.KIND) or "any" for s in specs})
    raise RunFailed(
        f"{len(specs)} trial(s) not run: no node of the cluster is left to run them (device kind: {', '.join(kinds)}); "
        "run the same command again when it has nodes: the stored trials are kept"
    )


def _failed(value: dict) -> bool:
    """A node's part of a trial that ended without a result (its row says why)."""
    return value["result"]["status"] != "ok"


def _arrived(
    spec: TrialSpec,
    slot: cluster.Slot,
    value: dict | list[dict] | cluster.Lost,
    trial_dir: Path,
    emit: Callable[[Event], None],
) -> TrialResult:
    """A trial's row from what its task returned (its log kept in `trial_dir` here), or from how it was lost; either
    way with the node it ran on. A trial spanning nodes returned one value per node: its row combines their ranks
    (time the slowest's, samples/s all of theirs, memory the largest)."""
    if isinstance(value, list):
        parts: list[TrialResult | None] = [TrialResult.from_dict(v["result"]) for v in value]
        combined = combine_ranks(parts, spec.settings.nproc * spec.settings.nnodes)
        ok = [r for r in parts if r is not None]
        # every rank's peak, and a load on any node (the row is as slow as its slowest rank)
        combined.rank_peak_mem_bytes = [p for r in ok for p in (r.rank_peak_mem_bytes or [])]
        combined.contended = True if any(r.contended for r in ok) else combined.contended
        combined.other_cpu_share = max((r.other_cpu_share or 0.0 for r in ok), default=None)
        logs = "".join(
            f"---- node {n} ({node.ip})\n{v['log']}" for n, (v, node) in enumerate(zip(value, slot.nodes, strict=True))
        )
        value = {"result": combined.to_dict(), "notes": [line for v in value for line in v["notes"]], "log": logs}
    if isinstance(value, cluster.Lost):
        result = TrialResult(spec.row, value.status, spec.repeat, value.message, spec.plan.to_dict())
    else:
        result = TrialResult.from_dict(value["result"])
        if "part" in value:  # the node of a group whose ranks failed first says why
            n = value["part"]
            result.message = f"node {n} ({slot.nodes[n].ip}): {result.message}"
        for line in value["notes"]:
            emit(Note(line))
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "stderr.log").write_text(value["log"])
    node: dict = {"host": slot.node.host, "node_ip": slot.node.ip, cluster.KIND: slot.node.kind}
    if slot.peers:
        node["nodes"] = [n.ip for n in slot.nodes]
    result.env = {**(result.env or {}), **node}
    return result


class ClusterLaunch:
    """A `Launch` that runs each trial on the cluster at `address`, one at a time (find-batch's probes: each decides
    the next), the cluster joined at the first; `close()` leaves it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.pool: cluster.Pool | None = None
        self.files = None

    def __call__(
        self, spec: TrialSpec, trial_dir: Path, timeout_s: float, emit: Callable[[Event], None]
    ) -> TrialResult:
        if self.pool is None:
            self.pool = _pool(self.address, spec)
            self.files = cluster.study_files(self.pool.ray, spec)
            emit(Note(_cluster_line(self.pool)))
        got: list[TrialResult] = []
        stranded = self.pool.run(
            [spec],
            _on_node,
            lambda sp, slot, meet: (sp.to_dict(), Retry(timeout_s), self.files, meet),
            lambda sp, slot: emit(Note(_placed(sp, slot))),
            lambda sp, slot, value: got.append(_arrived(sp, slot, value, trial_dir, emit)),
            failed=_failed,
        )
        if stranded:
            _no_node_left(stranded)
        return got[0]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _cluster_line(pool: cluster.Pool) -> str:
    kinds = {k: sum(n.kind == k for n in pool.nodes) for k in pool.kinds()}
    said = "; ".join(f"{n} x {k}" for k, n in kinds.items())
    line = f"the Ray cluster: {len(pool.nodes)} node(s), {len(pool.slots)} trial(s) at once ({said})"
    hosts = [n.host for n in pool.nodes]
    if shared := sorted({h for h in hosts if hosts.count(h) > 1}):
        line += (
            f"; nodes share host {', '.join(shared)}: trials side by side there share its caches and memory "
            "bandwidth and slow each other (the noise floor shows it)"
        )
    return line


def per_kind(specs: list[TrialSpec], prepared: PreparedStudy, kinds: list[str]) -> list[TrialSpec]:
    """The study's trials on a cluster of these device kinds: as they are on one kind; on several, the baseline's
    trials once per kind (each pinned to it), the others wherever there is room. A quality study's trials run
    wherever there is room: a seed's accuracy does not depend on the device it trained on."""
    if len(kinds) <= 1 or prepared.config.seed_per_repeat:
        return list(specs)
    baseline = {c.row.text for c in prepared.cells if c.row.is_baseline}
    out: list[TrialSpec] = []
    for spec in specs:
        if spec.row in baseline:
            out += [dataclasses.replace(spec, extra={**spec.extra, cluster.KIND: k}) for k in kinds]
        else:
            out.append(spec)
    return out


def _on_node(spec_blob: dict, cfg: Retry, files: bytes, meet: dict | None = None) -> dict:
    """On a node of the cluster, in a fresh Ray worker: the study's files unpacked here, the trial run by the local
    launcher as a child of this worker (exec'd: one trial per worker), with the CPUs Ray gave it as its threads, and
    run again while the node is loaded, as locally. Returns the result, its notes and the end of its log."""
    from trainwise.run import launcher  # heavy: the trial machinery, on the node only
    from trainwise.training import job as trial_job  # (light itself; beside the launcher it runs on)

    spec = TrialSpec.from_dict(spec_blob)
    root = cluster.settle(files, spec.settings.nproc if is_multiprocess(spec) else 1)  # each rank its share
    spec = cluster.on_this_node(spec, root)
    s = spec.settings
    notes: list[str] = []
    if s.model_kind == "dir" and not Path(s.model_ref).is_dir():
        why = f"the model directory {s.model_ref} is not on this node: put it at the same path on every node"
        result = TrialResult(spec.row, "error", spec.repeat, why, spec.plan.to_dict())
        return {"result": result.to_dict(), "notes": notes, "log": ""}
    trial_dir = root.parent / "trials" / f"{spec.key()}-{os.getpid()}"

    def emit(event: Event) -> None:
        if isinstance(event, Note):
            notes.append(event.text)

    try:
        if meet is None:
            result = _measured(spec, trial_dir, trial_job.launch, cfg, emit)
        else:  # this node's ranks of a trial spanning nodes (not run again under load: the group is measured once)
            job = trial_job.TrialJob(spec, trial_dir, Rendezvous.from_dict(meet))
            result = launcher.run(job, emit, backend="exec", timeout_s=timeout_for(spec, cfg.trial_timeout))
        log = (trial_dir / "stderr.log").read_bytes()[-LOG_TAIL:].decode(errors="replace")
    finally:
        shutil.rmtree(trial_dir, ignore_errors=True)
    return {"result": result.to_dict(), "notes": notes, "log": log}
