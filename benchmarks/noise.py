"""The machine's noise floor (BENCHMARKS.md §S5, issue 14): the default study's baseline repeated
N times on a quiet machine, then again beside K busy processes; the coefficient of variation of the
repeats' throughput, the noise floor trainwise derives, and what the contention check said.

    .venv/bin/python benchmarks/noise.py --repeat 5 --busy 1
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

from trainwise.study.store import read_rows


def study(out: Path, repeat: int, steps: int) -> dict:
    argv = [sys.executable, "-m", "trainwise.cli", "compare", "--strategies", "baseline,dynamic_pad"]
    argv += ["--repeat", str(repeat), "--max-steps", str(steps), "--eval-samples", "0", "--out", str(out)]
    argv += ["--retries", "0"]  # the load is the point here: keep the loaded runs
    subprocess.run(argv, check=True, capture_output=True)
    db = sqlite3.connect(out / "study.sqlite")
    results = [json.loads(r) for (r,) in db.execute("SELECT result FROM trials WHERE strategy = 'baseline'")]
    db.close()
    speeds = [r["samples_per_s"] for r in results]
    table = {e["strategy"]: e for e in read_rows(out / "results.json")}
    return {
        "samples_per_s": speeds,
        "cv": statistics.stdev(speeds) / statistics.mean(speeds),
        "noise_floor": table["baseline"]["noise_floor"],
        "contended": [r["contended"] for r in results],
        "other_cpu_share": [r["other_cpu_share"] for r in results],
        "dynamic_pad_time": "≈ baseline" if table["dynamic_pad"]["within_noise"] else table["dynamic_pad"]["rel_time"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--busy", type=int, default=1, help="busy-loop processes beside the loaded run")
    parser.add_argument("--out", default="runs/bench-noise")
    args = parser.parse_args()
    out = Path(args.out)
    quiet = study(out / "quiet", args.repeat, args.steps)
    print("quiet ", json.dumps(quiet))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        loaded = study(out / "loaded", args.repeat, args.steps)
    finally:
        for p in busy:
            p.kill()
    print("loaded", json.dumps(loaded))


if __name__ == "__main__":
    main()
