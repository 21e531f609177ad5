"""How often the plan's quality check rejects a row that trains exactly as the baseline does (issue 58's goal: at most
1 in 20).

    .venv/bin/python benchmarks/quality_replay.py OUT --rows smart_batch,adamw_fused+smart_batch --seeds 24 \
        [--steps 64] [--replays 20] [compare's model and data options...]

Two rows of identical math (AdamW and the same AdamW fused) are trained `--seeds` times each, seed by seed (the
quality study `trainwise plan` runs, in OUT), then the plan's check (`trainwise.search.verdicts.paired_check`,
sequential from MIN_SEEDS pairs to MAX_SEEDS) is replayed `--replays` times, each on paired seeds drawn in a random
order from those measured. Prints each replay's verdict and seeds, and the last line: `rejected R of N`.

`--rows ROW,ROW` (one row twice): the row against itself, the null hypothesis exactly but not bit for bit: it is
trained 2 x `--seeds` times and seed i is paired with seed i + `--seeds` (another init and data order from the
same distribution), so each pair differs by the run-to-run spread a real check sees.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import yaml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", default="smart_batch,adamw_fused+smart_batch")
    ap.add_argument("--seeds", type=int, default=24)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--replays", type=int, default=20)
    args, extra = ap.parse_known_args()
    from trainwise.api.options import CompareOptions
    from trainwise.core.quality import INCONCLUSIVE
    from trainwise.search import verdicts as quality
    from trainwise.study.prepare import prepare_study
    from trainwise.study.run import run_study
    from trainwise.training.job import launch

    options = CompareOptions.of(_pairs(extra), None)
    cfg = dataclasses.replace(options.resolve()[0], out=str(args.out))
    first, second = args.rows.split(",")
    itself = first == second
    rows_run, seeds = ([first], 2 * args.seeds) if itself else ([first, second], args.seeds)
    prepared = prepare_study(quality.quality_config(cfg, rows_run, args.steps, seeds))
    trials = run_study(prepared, launch, lambda *_a: None, lambda *_a: None)
    rows = {q.strategy: q for q in quality.verdicts(trials, False)}
    if itself:  # the first half's seeds against the second half's, relabelled pair by pair
        whole = rows[first]
        ordered = sorted(whole.seeds)
        b = _only(whole, set(ordered[: args.seeds]))
        a = _only(whole, set(ordered[args.seeds :]))
        a = dataclasses.replace(a, seeds=[s - args.seeds for s in a.seeds])
    else:
        a, b = rows[second], rows[first]
    print(f"{first}: {b.metric_name} {np.mean(b.values):.2f} over {len(b.values)} seeds (majority {b.majority})")
    print(f"{second}: {a.metric_name} {np.mean(a.values):.2f} over {len(a.values)} seeds")
    common = sorted(set(a.seeds) & set(b.seeds))
    rejected = 0
    for r in range(args.replays):
        order = list(np.random.default_rng(r).permutation(common))
        for n in range(quality.MIN_SEEDS, quality.MAX_SEEDS + 1):
            chosen = set(order[:n])
            check = quality.paired_check(_only(a, chosen), _only(b, chosen), None)
            if check.verdict != INCONCLUSIVE:
                break
        rejected += check.verdict == quality.WORSE
        print(f"replay {r}: {check.verdict} over {check.seeds} seeds ({check.said})")
    print(f"rejected {rejected} of {args.replays}")


def _only(row, seeds: set[int]):
    """The row's figures for these seeds only."""
    keep = [i for i, s in enumerate(row.seeds) if s in seeds]

    def pick(values: list) -> list:
        return [values[i] for i in keep] if len(values) == len(row.seeds) else values

    return dataclasses.replace(
        row,
        values=pick(row.values),
        eval_losses=pick(row.eval_losses),
        seeds=[row.seeds[i] for i in keep],
        first_losses=pick(row.first_losses),
        train_losses=pick(row.train_losses),
    )


def _pairs(extra: list[str]) -> dict:
    """compare's options written as flags (`--model-preset bert-tiny --max-length 64`) as keyword arguments."""
    out: dict = {}
    i = 0
    while i < len(extra):
        key = extra[i].lstrip("-").replace("-", "_")
        if i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            value: object = yaml.safe_load(extra[i + 1])  # "64" -> 64, as a study file reads it
            i += 2
        else:
            value, i = True, i + 1
        out[key] = value
    return out


if __name__ == "__main__":
    main()
