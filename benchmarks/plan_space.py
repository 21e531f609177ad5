"""A space measured whole, with its noise: what `benchmarks/plan_replay.py` replays a search on (issue 58).

    SPACE=a,b,c BATCHES=32,64 .venv/bin/python benchmarks/plan_space.py OUT [trainwise compare options...]

Every valid combination of the strategies in $SPACE (the baseline and each single row included), at the study's
batch size and at each size of $BATCHES, is run as a row of one study with `--repeat 3` (or the options' own
--repeat): the repeats interleaved, so drift touches every row alike. Combinations that set the same thing
(`dynamic_pad+smart_batch` sets what `smart_batch` sets) are one candidate, run once under its simplest name:
the replay serves either spelling from that row. Prints the number of distinct candidates and the command's wall
time; the study resumes like any other when run again.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

from trainwise import strategies
from trainwise.core.errors import ConfigError


def space(pool: list[str], batches: list[int], accum: int = 4) -> list[str]:
    """The distinct candidates of every valid subset of `pool`, each under its simplest spelling, at the study's
    batch and at each of `batches` (the baseline at the study's only)."""
    by_settings: dict[tuple, str] = {}
    for k in range(len(pool) + 1):
        for combo in itertools.combinations(pool, k):
            text = "+".join(combo) or "baseline"
            try:
                row = strategies.parse_row(text, accum)
            except ConfigError:
                continue
            key = tuple(row.plan.changed().items())
            by_settings.setdefault(key, row.text)  # the first seen is the fewest strategies
    rows = list(by_settings.values())
    return rows + [f"{r}@bs{b}" for b in batches for r in rows if r != "baseline"]


def main() -> None:
    out, extra = Path(sys.argv[1]), sys.argv[2:]
    pool = [n for n in os.environ.get("SPACE", "").split(",") if n]
    if not pool:
        raise SystemExit("name the space's strategies: SPACE=a,b,c")
    batches = [int(b) for b in os.environ.get("BATCHES", "").split(",") if b.strip()]
    rows = space(sorted(pool, key=list(strategies.REGISTRY).index), batches)
    repeat = [] if "--repeat" in extra else ["--repeat", "3"]
    cmd = [sys.executable, "-m", "trainwise.cli", "compare", "--out", str(out), "--strategies", ",".join(rows)]
    print(f"{len(rows)} candidates: {', '.join(rows)}", flush=True)
    began = time.monotonic()
    subprocess.run([*cmd, *repeat, *extra], check=True)
    print(f"{len(rows)} candidates measured in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
