"""The plan search's policy replayed on a study that already measured its whole space (issue 36).

    .venv/bin/python benchmarks/plan_replay.py STUDY [--max-trials N] [--no-batch-search] [--only a,b,c]

STUDY is a study that `benchmarks/plan_search.py` filled: its single rows, and every combination and batch
size of the exhaustive space, each measured once as a row. The replay runs `trainwise.search.policy.search` (the code
as it
is now) with `measure` reading those rows instead of training, so search policies are compared on the same
figures, at no trial's cost: which rows the search would have measured, in which order, where it would have
stopped, and how its pick compares with the exhaustive best. A row the search asks for that the study does not hold
is reported (the replay is then not complete), not invented. The replay applies no budgets or --never, and
the registry's device checks are this machine's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainwise import strategies
from trainwise.api.options import CompareOptions
from trainwise.api.plan import doubling, measured_rows, study_noise, study_rows, validity
from trainwise.search.policy import Measured, search, split_row
from trainwise.search.ranking import Constraints
from trainwise.study.prepare import resolve_device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--max-trials", type=int, default=12)
    ap.add_argument("--no-batch-search", action="store_true", help="as `trainwise plan --no-batch-search`")
    ap.add_argument("--only", default="", help="as `trainwise plan --only` (e.g. the exhaustive space's $SPACE)")
    args = ap.parse_args()
    out: Path = args.study
    cfg = CompareOptions.of({}, out / "study.yaml").resolve()[0]
    rows = study_rows(out)
    table = {m.row: m for m in measured_rows(rows, Constraints(), cfg.accum_steps)}
    # what a first `trainwise plan` on the study starts from: the single rows and `all` (an incumbent and an anchor
    # there too); the sized single rows plan_search.py added are left out, as a first search has none
    singles = [m for m in table.values() if (len(m.names) <= 1 or m.row == "all") and m.batch is None]
    missing: list[str] = []

    def measure(new: list[str]) -> list[Measured]:
        found = []
        for r in new:
            if r in table:
                found.append(table[r])
            else:
                missing.append(r)
                names, batch = split_row(r)
                found.append(Measured(r, names, None, None, status="not in the study", batch=batch))
        return found

    next_batch = doubling(out, cfg.batch_size, not args.no_batch_search)
    noise = study_noise(rows)
    order = list(strategies.REGISTRY)
    only = frozenset(n for n in args.only.split(",") if n)
    valid = validity(cfg.task, cfg.accum_steps, resolve_device(cfg.device)[1], only)
    found = search(singles, measure, valid, order, noise=noise, max_trials=args.max_trials, next_batch=next_batch)
    # the exhaustive space plan_search.py ran: every row with two or more strategies or a batch size of its own
    # (whatever its status: a row that failed was a trial too), not `all`
    space = [m for m in table.values() if m.row != "all" and (len(m.names) > 1 or m.batch)]
    best = min((m for m in space if m.ok), key=lambda m: m.rel_time or 1.0, default=None)
    if best is None:
        raise SystemExit(f"{out} holds no row of an exhaustive space that finished ok: run benchmarks/plan_search.py")
    pick = table.get(found.incumbent or "")
    floor = f"±{noise:.1%}" if noise is not None else "none"
    print(
        f"study {out}: noise floor {floor} (the search's ±{found.noise:.1%}); an exhaustive space of {len(space)} rows"
    )
    for c in found.candidates:
        if c.trial is not None:
            meas = f"{c.measured_time:.1%}" if c.measured_time is not None else "-"
            print(f"  trial {c.trial} (round {c.round}): {c.row:45s} predicted {c.predicted_time:.1%} measured {meas}")
    print(f"stopped: {found.stopped}")
    print(f"pick: {found.incumbent} {pick.rel_time:.1%}" if pick and pick.rel_time else f"pick: {found.incumbent}")
    print(f"exhaustive best: {best.row} {best.rel_time:.1%}")
    if pick and pick.rel_time and best.rel_time:
        print(f"pick / exhaustive best: {pick.rel_time / best.rel_time:.3f}")
    share = f" ({found.trials / len(space):.0%})" if space else ""
    print(f"trials: {found.trials} against the exhaustive space's {len(space)}{share}")
    if missing:
        print(f"NOT COMPLETE: the study lacks {len(missing)} row(s) the search asked for: {', '.join(missing)}")


if __name__ == "__main__":
    main()
