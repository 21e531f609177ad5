"""Compare `trainwise tune` studies on the same budget (BENCHMARKS.md §Q3).

    python benchmarks/tune_compare.py runs/bench-tune8-*-*

One row per study directory (named ...-SEARCH-SEED): the best metric, the optimizer steps spent,
the best-so-far at fixed budgets of steps, the steps at which it came within 1 point of its best,
and the machine time; then the median per search over the seeds.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

BUDGETS = (200, 400, 800)


def best_at(curve: list[list[float]], budget: int) -> float | None:
    """The best-so-far after `budget` optimizer steps (None: nothing evaluated by then)."""
    seen = [value for spent, value in curve if spent <= budget]
    return seen[-1] if seen else None


def row(study: Path) -> dict:
    r = json.loads((study / "tune_result.json").read_text())
    search, seed = study.name.rsplit("-", 2)[-2:]
    curve = r["curve"]
    best = r["best_value"]
    near = next((spent for spent, value in curve if best is not None and value >= best - 1.0), None)
    states = [t["state"] for t in r["trials"]]
    return {
        "search": search,
        "seed": seed,
        "best": best,
        "spent": curve[-1][0] if curve else 0,
        **{f"at{b}": best_at(curve, b) for b in BUDGETS},
        "near": near,
        "pruned": states.count("pruned"),
        "exploits": len(r.get("mutations", [])),
        "machine_s": r.get("machine_s", 0.0),
    }


def fmt(v, pct: bool = True) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}%" if pct else f"{v:.0f}"


def main(paths: list[str]) -> None:
    rows = [row(Path(p)) for p in sorted(paths) if (Path(p) / "tune_result.json").is_file()]
    at = " | ".join(f"best-so-far at {b} steps" for b in BUDGETS)
    head = f"| search | seed | best accuracy | steps spent | {at} | steps to within 1 point | pruned / exploits |"
    print(head + " machine time |")
    print("|---" * (7 + len(BUDGETS)) + "|")
    for r in rows:
        budgets = " | ".join(fmt(r[f"at{b}"]) for b in BUDGETS)
        print(
            f"| {r['search']} | {r['seed']} | {fmt(r['best'])} | {r['spent']} | {budgets} | {fmt(r['near'], False)} | "
            f"{r['pruned']} / {r['exploits']} | {r['machine_s']:.0f} s |"
        )
    print()
    print(f"| search (median of seeds) | best accuracy | steps spent | {at} |")
    print("|---" * (3 + len(BUDGETS)) + "|")
    for search in dict.fromkeys(r["search"] for r in rows):
        group = [r for r in rows if r["search"] == search]

        def med(key: str, group: list[dict] = group) -> float | None:
            values = [r[key] for r in group if r[key] is not None]
            return statistics.median(values) if values else None

        budgets = " | ".join(fmt(med(f"at{b}")) for b in BUDGETS)
        print(f"| {search} | {fmt(med('best'))} | {fmt(med('spent'), False)} | {budgets} |")


if __name__ == "__main__":
    main(sys.argv[1:])
