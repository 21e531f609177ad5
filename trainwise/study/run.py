"""A study's run: the trials not in the store yet, one process each, stored as each ends (so the same command
resumes), re-measured when the machine was busy, and the study's projected time as it goes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainwise import projection
from trainwise.config import StudyConfig, TrialSpec
from trainwise.errors import ConfigError
from trainwise.events import Event, Note
from trainwise.files import failed, refused_by
from trainwise.measure import contention
from trainwise.results import TrialResult
from trainwise.strategies import Support
from trainwise.study.prepare import PreparedStudy
from trainwise.study.store import STORE, Store, Trials, hold, still_there

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
