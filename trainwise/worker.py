"""Entry point of a trial's own process: `python -m trainwise.worker SPEC.json RESULT.json`.

Progress goes to stdout as JSON lines; the result is written atomically to RESULT.json. An
exception becomes an `error` row and an out-of-memory an `oom` row. A process that dies without
writing a result (killed, segfault) is classified by the launcher.

Test seam: TRAINWISE_FAULT="TARGET:KIND@STEP" injects a fault into the trial whose strategy is
TARGET (or whose batch size is N, for TARGET "bs=N"), at that optimizer step; KIND is
raise | oom | kill | hang.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from trainwise.config import TrialSpec
from trainwise.files import write_atomic
from trainwise.launcher import rank_result_path
from trainwise.lifeline import die_with_parent
from trainwise.results import TrialResult

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


def _fault_for(strategy: str, batch_size: int) -> tuple[str, int] | None:
    spec = os.environ.get("TRAINWISE_FAULT", "")
    target, _, rest = spec.partition(":")
    if not rest or target not in (strategy, f"bs={batch_size}"):
        return None
    kind, _, step = rest.partition("@")
    return kind, int(step or 1)


def _emitter(strategy: str, batch_size: int, main_rank: bool = True):
    fault = _fault_for(strategy, batch_size)

    def emit(event: dict) -> None:
        if main_rank:  # one progress stream per trial, however many ranks
            print(json.dumps(event), flush=True)
        if fault and event.get("event") == "step" and event["step"] == fault[1]:
            kind = fault[0]
            if kind == "raise":
                raise RuntimeError(f"injected fault at step {fault[1]}")
            if kind == "oom":
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "hang":
                time.sleep(10**6)

    return emit


def main(argv: list[str]) -> int:

    die_with_parent()  # a trial never outlives the study (or torchrun) that started it
    spec_path, result_path = Path(argv[0]), Path(argv[1])

    spec = TrialSpec.from_dict(json.loads(spec_path.read_text()))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if "RANK" in os.environ:  # launched by torchrun (data parallel or ZeRO): one result per rank
        result_path = rank_result_path(result_path, rank)
    try:
        from trainwise.trial import run_trial  # heavy: torch, transformers; in the try: a failed import is a row

        trace = None
        if spec.settings.profile:
            trace = result_path.parent / (f"trace.rank{rank}.json" if "RANK" in os.environ else "trace.json")
        result = run_trial(spec, progress=_emitter(spec.row, spec.settings.batch_size, rank == 0), trace_path=trace)
        result.trace = str(trace) if trace else None
    except BaseException as exc:  # every failure is a row, never a lost study
        if isinstance(exc, KeyboardInterrupt):
            raise
        status = "oom" if is_oom(exc) else "error"
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"

        traceback.print_exc(file=sys.stderr)
        result = TrialResult(
            strategy=spec.row, status=status, repeat=spec.repeat, message=message[:500], plan=spec.plan.to_dict()
        )
    write_atomic(result_path, json.dumps(result.to_dict()))  # a full disk: the launcher sees no result
    # under torchrun a failed rank exits non-zero, so torchrun stops the ranks waiting on it in a collective
    return 1 if world > 1 and result.status != "ok" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
