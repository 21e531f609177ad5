"""`trainwise plan` against exhaustive search over the same space (issue 36's goal).

    .venv/bin/python benchmarks/plan_search.py OUT [trainwise plan options...]
    SPACE=a,b,c .venv/bin/python benchmarks/plan_search.py OUT ...   # the exhaustive space: these strategies
    BATCHES=32,64 ...   # and every single row and combination at these batch sizes too (`row@bsN`)

1. `trainwise plan --out OUT ...` (the single rows, the search, the quality check), timed.
2. The space: every valid combination (two or more) of the rows that helped beyond the noise floor (round 1's
   pool), or of the strategies in $SPACE (those the search could have reached by adding one at a time), each
   run as a row of the same study (`trainwise compare --config OUT/study.yaml`), so the exhaustive best is
   measured beside the plan with the same baseline and noise floor.
3. One line per figure: the best single row, `all`, the plan, the exhaustive best, the search's trials and wall
   time against the exhaustive search's, and the search's share of one projected epoch of the plan.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.study.store import read_results


def main() -> None:
    out, extra = Path(sys.argv[1]), sys.argv[2:]
    tw = [sys.executable, "-m", "trainwise.cli"]
    began = time.monotonic()
    subprocess.run([*tw, "plan", "--out", str(out), *extra], check=True)
    plan_s = time.monotonic() - began
    plan = json.loads((out / "plan.json").read_text())
    search = plan["search"]
    drawn = os.environ.get("SPACE", "").split(",") if os.environ.get("SPACE") else None
    pool = sorted(
        drawn or {n for c in search["candidates"] if c["round"] == 1 for n in c["row"].split("+")},
        key=list(strategies.REGISTRY).index,
    )
    combos = []
    for k in range(2, len(pool) + 1):
        for c in itertools.combinations(pool, k):
            try:
                combos.append(strategies.parse_row("+".join(c), 4).text)
            except ConfigError:
                continue
    sizes = [int(b) for b in os.environ.get("BATCHES", "").split(",") if b.strip()]
    if sizes:  # the batch sizes the search could reach: each single row and combination at each of them
        combos += [f"{text}@bs{b}" for b in sizes for text in [*pool, *combos] if "@" not in text]
    rows = [r.row_text for r in read_results(out)]
    began = time.monotonic()
    new = [c for c in combos if c not in rows]
    if new:
        cmd = [*tw, "compare", "--config", str(out / "study.yaml"), "--strategies", ",".join([*rows, *new])]
        subprocess.run(cmd, check=True)
    exhaustive_s = time.monotonic() - began
    table = {r.row_text: r for r in read_results(out)}
    best = min((table[c] for c in combos if table[c].status == "ok"), key=lambda r: r.rel_time, default=None)
    lines = {ln["label"]: ln for ln in plan["lines"]}
    noise = search["noise"]
    at = f" at the study's batch and {','.join(map(str, sizes))}" if sizes else ""
    print(f"space ({'$SPACE' if drawn else 'round 1'}): {', '.join(pool)}{at}; exhaustive: {len(combos)} rows")
    for label in ("baseline", "best single row", "all", "plan"):
        ln = lines.get(label)
        if ln:
            print(f"{label:16s} {ln['row']:45s} time {ln['rel_time']:.1%}  mem {ln['rel_mem']:.1%}")
    if best is not None:
        print(f"{'exhaustive best':16s} {best.row_text:45s} time {best.rel_time:.1%}  mem {best.rel_mem:.1%}")
        mine = table[plan["plan"]].rel_time if plan["plan"] in table else None
        if mine is not None:
            print(f"plan / exhaustive best: {mine / best.rel_time:.3f} (noise floor ±{noise:.1%})")
    print(
        f"search: {search['trials']} trials, {search['wall_s']:.0f} s (plan command {plan_s:.0f} s in all: singles "
        f"{plan['singles_s']:.0f} s, quality {plan['quality_s']:.0f} s); exhaustive: {len(combos)} trials "
        f"({len(new)} run now, {exhaustive_s:.0f} s)"
    )
    if plan.get("search_share_of_epoch") is not None:
        print(f"search / one projected epoch of the plan: {plan['search_share_of_epoch']:.1%}")


if __name__ == "__main__":
    main()
