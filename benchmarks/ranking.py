"""P4: does a short trial rank plans the way a full run does? (issue 15, part 2)

compare times each plan over a few optimizer steps; what a user cares about is the time of the whole run.
This benchmark ranks the same plans, on the same machine and data, by the samples/s of short trials
(`--max-steps` 4, 8, 16, 32: the first steps untimed) and by the samples/s over one whole epoch (the
same loop with `--max-steps` = the epoch's steps), and reports Kendall's tau-b between each short
ranking and the full-run one, plus each row's time % both ways. A short trial is long enough when its
ranking agrees with the full run's (tau near 1) and stops changing as steps grow.

Usage: python benchmarks/ranking.py [--out runs/bench-ranking] [--train-samples 800] [--steps 4,8,16,32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trainwise.study.store import read_rows

ROWS = "baseline,bf16,grad_accum,grad_ckpt,adafactor,dynamic_pad,smart_batch,freeze_embeddings,all"


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two paired samples (ties counted as neither concordant nor discordant)."""
    concordant = discordant = ties_x = ties_y = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    pairs_x = concordant + discordant + ties_x
    pairs_y = concordant + discordant + ties_y
    return (concordant - discordant) / (pairs_x * pairs_y) ** 0.5 if pairs_x and pairs_y else float("nan")


def study(out: Path, steps: int, train_samples: int) -> tuple[dict[str, float], float]:
    """samples/s per row of one compare study (its own --out), and its wall time."""
    argv = [sys.executable, "-m", "trainwise.cli", "compare", "--strategies", ROWS, "--no-remeasure"]
    argv += ["--max-steps", str(steps), "--warmup-steps", str(min(3, steps - 1)), "--eval-samples", "0"]
    argv += ["--max-train-samples", str(train_samples), "--out", str(out), "--force"]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{done.stderr[-3000:]}")
    rows = read_rows(out / "results.json")
    return {r["strategy"]: r["samples_per_s"] for r in rows if r["status"] == "ok"}, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench-ranking")
    ap.add_argument("--train-samples", type=int, default=800, help="training rows (the epoch's size)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", default="4,8,16,32", help="short trials' --max-steps")
    a = ap.parse_args()
    out = Path(a.out)
    epoch_steps = a.train_samples // a.batch_size
    print(f"full run: one epoch = {epoch_steps} steps of {a.batch_size}", flush=True)
    full, full_s = study(out / "full", epoch_steps, a.train_samples)
    print(f"  {full_s:.0f} s", flush=True)
    names = sorted(full)
    results = {"epoch_steps": epoch_steps, "full": full, "full_wall_s": full_s, "short": {}}
    for steps in (int(s) for s in a.steps.split(",")):
        short, wall = study(out / f"steps{steps}", steps, a.train_samples)
        common = [n for n in names if n in short]
        tau = kendall_tau_b([short[n] for n in common], [full[n] for n in common])
        results["short"][steps] = {"samples_per_s": short, "tau": tau, "wall_s": wall}
        print(f"{steps:3d} steps: tau-b {tau:+.2f}  ({wall:.0f} s)", flush=True)
    print("\n| row | full-epoch time % | " + " | ".join(f"{s} steps" for s in results["short"]) + " |")
    print("|---|---:|" + "---:|" * len(results["short"]))
    for n in names:
        cells = [f"{100 * full['baseline'] / full[n]:.0f}%"]
        for r in results["short"].values():
            sps = r["samples_per_s"]
            cells.append(f"{100 * sps['baseline'] / sps[n]:.0f}%" if n in sps and "baseline" in sps else "-")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("| Kendall tau-b vs full | 1 | " + " | ".join(f"{r['tau']:+.2f}" for r in results["short"].values()) + " |")
    (out / "ranking.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
