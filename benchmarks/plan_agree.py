"""The same question asked three times (issue 58): `trainwise plan` run into three folders, then the three picks
measured side by side in one compare.

    .venv/bin/python benchmarks/plan_agree.py OUT [--runs 3] [--repeat 3] [trainwise plan options...]

Runs `trainwise plan --out OUT/run1 ...`, `OUT/run2`, ... one after another (each a study of its own, from nothing),
then `trainwise compare --config OUT/run1/study.yaml --out OUT/side --strategies baseline,PICK1,PICK2,... --repeat N`
(the picks, each once, the baseline beside them, N repeats interleaved), and prints each run's pick, its trials, its
wall time and its time % side by side; the last line: `picks within X% of one another side by side` (the slowest
pick's time over the fastest's, minus one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from trainwise.study.store import read_results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    args, extra = ap.parse_known_args()
    tw = [sys.executable, "-m", "trainwise.cli"]
    picks: list[tuple[str, dict, float]] = []
    for n in range(1, args.runs + 1):
        out = args.out / f"run{n}"
        began = time.monotonic()
        subprocess.run([*tw, "plan", "--out", str(out), *extra], check=True, stdout=subprocess.DEVNULL)
        plan = json.loads((out / "plan.json").read_text())
        pick = plan["plan"] or plan["search"]["fastest"]
        picks.append((pick, plan["search"], time.monotonic() - began))
        print(f"run {n}: {pick} ({plan['search']['trials']} trials, {plan['search']['repeats']} repeated, "
              f"{time.monotonic() - began:.0f} s; stopped: {plan['search']['stopped']})", flush=True)  # fmt: skip
    rows = list(dict.fromkeys(p for p, _, _ in picks))
    side = args.out / "side"
    cmd = [*tw, "compare", "--config", str(args.out / "run1" / "study.yaml"), "--out", str(side)]
    cmd += ["--strategies", ",".join(["baseline", *rows]), "--repeat", str(args.repeat)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    table = {r.row_text: r for r in read_results(side)}
    for n, (pick, _search, _s) in enumerate(picks, start=1):
        r = table.get(pick)
        said = f"{r.rel_time:.1%}" if r is not None and r.rel_time else "not measured"
        print(f"run {n}'s pick {pick}: {said} of the baseline's time side by side")
    times = [table[p].rel_time for p in rows if p in table and table[p].rel_time]
    floor = next((r.noise_floor for r in table.values() if r.baseline and r.noise_floor is not None), None)
    said = f" (the side-by-side study's noise floor ±{floor:.1%})" if floor is not None else ""
    print(f"picks within {max(times) / min(times) - 1:.1%} of one another side by side{said}")


if __name__ == "__main__":
    main()
