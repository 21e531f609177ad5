"""benchmarks/plan_replay.py's --by-round: a host that changes speed between a space's measurement rounds is taken
out, and what each row's trials spread beyond it stays."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _replay():
    spec = importlib.util.spec_from_file_location("plan_replay", ROOT / "benchmarks" / "plan_replay.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["plan_replay"] = module
    spec.loader.exec_module(module)
    return module


def _spread(measured) -> float:
    """Within-row sd of log pace, pooled over rows."""
    devs = []
    for trials in measured.table.values():
        logs = [math.log(t.sps) for t in trials]
        devs += [x - statistics.fmean(logs) for x in logs]
    return math.sqrt(sum(d * d for d in devs) / len(devs))


def test_a_round_that_ran_faster_is_taken_out_and_the_rows_own_spread_stays():
    replay = _replay()
    space = replay.Measured.read(ROOT / "benchmarks" / "spaces" / "d-images.json")
    sped = {k: [dataclasses.replace(t, sps=t.sps * 1.6) if i == 2 else t for i, t in enumerate(v)]
            for k, v in space.table.items()}  # fmt: skip
    drifted = replay.Measured(sped, space.base, space.accum, space.task)
    fixed, factors = drifted.by_round()
    plain, plain_factors = space.by_round()
    assert factors[2] / factors[0] > 1.5 and abs(plain_factors[2] / plain_factors[0] - 1) < 0.1
    assert _spread(drifted) > 1.5 * _spread(space)  # the drift reads as noise
    assert abs(_spread(fixed) - _spread(plain)) < 1e-9  # taken out: the rows' own spread, as if it never happened
    truth, want = fixed.truth(), plain.truth()
    assert all(abs(truth[k] / want[k] - 1) < 1e-9 for k in want)
