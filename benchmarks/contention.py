"""A busy process started mid-study: are the contended trials re-measured, and is the table readable?

Runs `trainwise compare` (the default model, a few rows) and, `--start` seconds in, starts `--busy`
processes spinning (`while True: pass`) for `--seconds`, then stops them. Prints the study's output
(its re-measure lines, table and notes) and a summary: per row, discarded runs, contended, step time.
Usage:

    .venv/bin/python benchmarks/contention.py [--out runs/bench-contention] [--start 20] [--seconds 40] [--busy 1]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainwise.study.store import read_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench-contention")
    ap.add_argument("--start", type=float, default=20.0)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--busy", type=int, default=1)
    ap.add_argument("--strategies", default="baseline,grad_ckpt,adafactor,dynamic_pad,smart_batch")
    args = ap.parse_args()
    tw = str(Path(sys.executable).with_name("trainwise"))
    cmd = [tw, "compare", "--strategies", args.strategies, "--out", args.out, "--force"]
    t0 = time.perf_counter()
    study = subprocess.Popen(cmd)

    def load() -> None:
        time.sleep(args.start)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        print(f"[contention.py] {args.busy} busy process(es) started at {time.perf_counter() - t0:.0f} s", flush=True)
        time.sleep(args.seconds)
        for p in busy:
            p.kill()
            p.wait()
        print(f"[contention.py] busy process(es) stopped at {time.perf_counter() - t0:.0f} s", flush=True)

    threading.Thread(target=load, daemon=True).start()
    code = study.wait()
    wall = time.perf_counter() - t0
    rows = read_rows(Path(args.out) / "results.json")
    print(f"[contention.py] study exit {code}, {wall:.0f} s")
    for e in rows:
        if e["status"] == "ok":
            print(
                f"  {e['strategy']}: step {e['step_time_s']:.3f} s, time % {100 * (e['rel_time'] or 0):.0f}, "
                f"discarded {e.get('discarded_runs', 0)}, contended {e.get('contended')}, "
                f"others {100 * (e.get('other_cpu_share') or 0):.0f}%"
            )
    print(f"  noise floor ±{100 * (rows[0].get('noise_floor') or 0):.1f}% ({rows[0].get('noise_source')})")


if __name__ == "__main__":
    main()
