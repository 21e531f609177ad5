"""A compare trial as a job of the launcher's one child protocol (trainwise.run.launcher): its spec measured in its own
process (under torchrun for ranks and ZeRO), whatever happens to it a TrialResult. Light: the trial's own module
(torch, transformers) is imported in the child."""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.core.results import TrialResult, combine_ranks
from trainwise.run.events import Emit
from trainwise.run.faults import is_oom, seamed
from trainwise.run.launcher import Exit, Listener, Place, run
from trainwise.run.ranks import Ranks, Rendezvous, is_multiprocess
from trainwise.spec.config import TrialSpec


@dataclass(frozen=True)
class TrialJob:
    """A compare trial: the spec (model, data, plan, settings) measured in `trial_dir` (its log, the job
    file and, with --profile, its trace), in one process or under torchrun for ranks and ZeRO."""

    spec: TrialSpec
    trial_dir: Path
    rendezvous: Rendezvous | None = None  # a trial whose ranks span nodes: this node's place among them

    def place(self) -> Place:
        s = self.spec.settings
        ranks = s.nproc if is_multiprocess(self.spec) else None
        return Place(self.trial_dir / "job.json", self.trial_dir / "stderr.log", ranks, s.device, self.rendezvous)

    def to_dict(self) -> dict:
        meet = None if self.rendezvous is None else self.rendezvous.to_dict()
        return {"spec": self.spec.to_dict(), "trial_dir": str(self.trial_dir), "rendezvous": meet}

    @classmethod
    def from_dict(cls, blob: dict) -> TrialJob:
        meet = Rendezvous.from_dict(blob.get("rendezvous"))
        return cls(TrialSpec.from_dict(blob["spec"]), Path(blob["trial_dir"]), meet)

    def run(self, emit: Emit) -> TrialResult:
        """The trial, in this rank; an exception becomes an `error` row, an out-of-memory an `oom` row."""
        spec = self.spec
        ranked = "RANK" in os.environ  # launched by torchrun (data parallel or ZeRO): a trace per rank
        try:
            # heavy: torch, transformers; in the try: a failed import is a row
            from trainwise.training.trial import (
                run_trial,
            )

            trace = None
            if spec.settings.profile:
                trace = self.trial_dir / (f"trace.rank{Ranks.from_env().rank}.json" if ranked else "trace.json")
            result = run_trial(spec, progress=seamed(emit, spec.row, spec.settings.batch_size), trace_path=trace)
            result.trace = str(trace) if trace else None
        except BaseException as exc:  # every failure is a row, never a lost study
            if isinstance(exc, KeyboardInterrupt):
                raise
            status = "oom" if is_oom(exc) else "error"
            message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            traceback.print_exc(file=sys.stderr)
            plan = spec.plan.to_dict()
            result = TrialResult(strategy=spec.row, status=status, repeat=spec.repeat, message=message[:500], plan=plan)
        return result

    def ended(self, results: list[TrialResult | None], end: Exit) -> TrialResult:
        """The trial's row: its ranks' results combined, or what happened to its process."""
        spec = self.spec
        base: dict[str, Any] = {"strategy": spec.row, "repeat": spec.repeat, "plan": spec.plan.to_dict()}
        if end.timed_out:
            message = f"no result within --trial-timeout {end.timeout_s:g}s; killed"
            return TrialResult(status="timeout", message=message, wall_s=end.wall_s, **base)
        ranks = self.place().ranks
        if any(r is not None for r in results):
            # this node's ranks; over several nodes each rank knows the whole group's size
            world = None if ranks is None else ranks * (self.rendezvous.nnodes if self.rendezvous else 1)
            result = combine_ranks(results, world) if world is not None else results[0]
            assert result is not None
            result.wall_s = end.wall_s
            return result
        if end.killed_by is not None:
            message = f"trial process killed by {end.killed_by}"
        else:
            message = f"trial process exited with code {end.code} and no result: {end.tail[:300]}"
        return TrialResult(status="crashed", message=message, wall_s=end.wall_s, **base)


def launch(spec: TrialSpec, trial_dir: Path, timeout_s: float, on_event: Listener) -> TrialResult:
    """One compare trial in a fresh process (under torchrun for ranks and ZeRO); whatever happens to it
    becomes a TrialResult. `trial_dir` keeps its spec.json and its stderr.log."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "spec.json").write_text(json.dumps(spec.to_dict(), indent=1))
    return run(TrialJob(spec, trial_dir), on_event, timeout_s=timeout_s)
