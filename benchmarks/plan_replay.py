"""The plan search replayed with its noise on a space measured whole (issue 58).

    .venv/bin/python benchmarks/plan_replay.py STUDY [--draws 100] [--max-trials 8] [--max-rounds 3] [--old 3a936b5]
                                                     [--show N]
    .venv/bin/python benchmarks/plan_replay.py STUDY --save benchmarks/spaces/NAME.json   (then replay the file)

STUDY is a study that `benchmarks/plan_space.py` filled (or a space saved from one with `--save`): every candidate
of a space (each valid combination of its strategies at each of its batch sizes), each with several trials
(`--repeat 3`). A draw is one imagined study on that space: its single rows and its baseline pair drawn from their
measured trials, and every trial a search asks for drawn from that row's trials (without replacement while they
last). The search as it is now (`trainwise.search.acquisition`) runs on each draw, and the search of commit `--old`
(its `search/policy.py`, read from git) on the same draws: the k-th trial either search asks of a row is that row's
k-th draw. A row's true time is the mean of its trials' time per sample over the mean of the baseline's. For each
search it prints the median and the 90th percentile of its pick's true time over the true best, and the trials it
used (the new search's repeats included); the last line is the new search's: `median R p90 R trials T of S` (T: the
median trials, S: the space's candidates beyond the baseline and the single rows at the study's batch). A smaller
budget (`--max-trials`, `--max-rounds`) says what the pick loses on fewer trials; `--by-round` takes each
measurement round's common drift out first (a host that sped up between rounds).

The replay applies no memory budget, and the old search's confirmation of a floor past ±10% (a study three times
longer) is not replayed: its pick is `policy.search`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from trainwise import strategies
from trainwise.search.acquisition import REPEAT_ROUNDS, Search, Searching, search
from trainwise.search.plan_inputs import (
    Key,
    Observation,
    build_space,
    observation,
    plan_of,
    split_row,
    trial_seconds,
    validity,
)
from trainwise.strategies.knobs import TrialPlan


@dataclass(frozen=True)
class Trial:
    row: str
    key: Key
    names: frozenset[str]
    status: str
    sps: float | None  # samples/s
    step_s: float | None
    phases: tuple | None  # data wait, forward/backward, optimizer, step (s)
    peak: float | None
    wall_s: float | None = None  # the trial's wall time: process, model, data, steps, evaluation
    epoch_s: float | None = None  # an epoch of the study's data at this row's pace


@dataclass
class Measured:
    """A space measured whole: each candidate's trials, the baseline's, and what is true of each."""

    table: dict[Key, list[Trial]]
    base: Key
    accum: int
    task: str

    @classmethod
    def load(cls, study: Path) -> Measured:
        """From a study `plan_space.py` filled, or from a space saved by `--save` (a JSON file, tens of KB: a study
        takes minutes to hours of CPU to measure, and its folder is not kept with the code)."""
        if study.is_file():
            return cls.read(study)
        keys = json.loads((study / "progress.json").read_text()).get("keys")
        db = sqlite3.connect(study / "study.sqlite")
        table: dict[Key, list[Trial]] = defaultdict(list)
        base, settings = None, {}
        for key, spec, result in db.execute("SELECT key, spec, result FROM trials ORDER BY rowid"):
            if keys is not None and key not in keys:
                continue
            spec, r = json.loads(spec), json.loads(result)
            settings = spec["settings"]
            names, _ = split_row(spec["row"])
            k = Key(TrialPlan.from_dict(spec["plan"]), int(settings["batch_size"]))
            ok = r["status"] == "ok" and r.get("samples_per_s")
            step = r.get("step_time_median_s") or r.get("step_time_s")
            phases = (r.get("data_wait_s"), r.get("compute_s"), r.get("optimizer_s"), step)
            trial = Trial(spec["row"], k, names, r["status"], r.get("samples_per_s"), r.get("step_time_s"),
                          phases if ok else None, r.get("peak_mem_bytes"),
                          r.get("wall_s"), r.get("epoch_time_s"))  # fmt: skip
            table[k].append(trial)
            if not names:
                base = k
        assert base is not None, f"{study}: no baseline"
        return cls(dict(table), base, int(settings.get("accum_steps") or 1), str(settings.get("task")))

    def save(self, path: Path, source: str) -> None:
        """Every trial, its row's settings and the study's task and accumulation: what a replay reads."""
        trials = [
            {"plan": t.key.plan.to_dict(), "batch": t.key.batch, "names": sorted(t.names),
             **{f.name: getattr(t, f.name) for f in dataclasses.fields(Trial) if f.name not in ("key", "names")}}
            for trials in self.table.values() for t in trials
        ]  # fmt: skip
        head = json.dumps({"source": source, "task": self.task, "accum": self.accum})[:-1]
        lines = ",\n".join(json.dumps(t, separators=(",", ":")) for t in trials)  # a trial a line
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'{head}, "trials": [\n{lines}\n]}}\n')

    @classmethod
    def read(cls, path: Path) -> Measured:
        doc = json.loads(path.read_text())
        table: dict[Key, list[Trial]] = defaultdict(list)
        base = None
        for t in doc["trials"]:
            key = Key(TrialPlan.from_dict(t["plan"]), int(t["batch"]))
            phases = tuple(t["phases"]) if t["phases"] is not None else None
            own = {k: v for k, v in t.items() if k not in ("plan", "batch", "names", "phases")}
            table[key].append(Trial(key=key, names=frozenset(t["names"]), phases=phases, **own))
            if not t["names"]:
                base = key
        assert base is not None, f"{path}: no baseline"
        return cls(dict(table), base, int(doc["accum"]), str(doc["task"]))

    def by_round(self) -> tuple[Measured, list[float]]:
        """The space with each round's common drift taken out: a row's k-th trial ran in the study's k-th round (its
        repeats interleaved, every row once a round), and a round's factor is the median over rows of its trial's
        pace over the row's geometric mean. Each trial's pace is divided by its round's factor (its times
        multiplied), so a host that sped up between rounds no longer reads as noise; what each row's trials spread
        beyond their round's drift stays."""
        rounds = min(len(v) for v in self.table.values())
        logs = {k: [math.log(t.sps) for t in v[:rounds] if t.status == "ok" and t.sps] for k, v in self.table.items()}
        full = [v for v in logs.values() if len(v) == rounds]
        factors = [math.exp(statistics.median(v[r] - statistics.fmean(v) for v in full)) for r in range(rounds)]

        def fix(t: Trial, f: float) -> Trial:
            if t.status != "ok" or not t.sps:
                return t
            times = {
                n: (getattr(t, n) * f if getattr(t, n) is not None else None) for n in ("step_s", "wall_s", "epoch_s")
            }
            phases = tuple(p * f if p is not None else None for p in t.phases) if t.phases else t.phases
            return dataclasses.replace(t, sps=t.sps / f, phases=phases, **times)

        table = {k: [fix(t, factors[i]) if i < rounds else t for i, t in enumerate(v)] for k, v in self.table.items()}
        return Measured(table, self.base, self.accum, self.task), factors

    def truth(self) -> dict[Key, float]:
        """Each candidate's time per sample (the mean of its trials') over the baseline's."""
        base = statistics.fmean(1 / t.sps for t in self.table[self.base] if t.status == "ok" and t.sps)
        out = {}
        for k, trials in self.table.items():
            ok = [1 / t.sps for t in trials if t.status == "ok" and t.sps]
            out[k] = statistics.fmean(ok) / base if ok else math.inf
        return out

    def key_of(self, row: str) -> Key:
        names, batch = split_row(row)
        return Key(plan_of(names, self.accum) or TrialPlan(), batch or self.base.batch)


class Draw:
    """One imagined study: each row's trials in a random order (then drawn with replacement); the k-th ask of a row
    (by either search) is answered by its k-th draw."""

    def __init__(self, space: Measured, seed: int):
        self.space, self.rng = space, np.random.default_rng(seed)
        self.order = {k: list(self.rng.permutation(len(v))) for k, v in space.table.items()}
        b1, b2 = self.get(space.base, 0), self.get(space.base, 1)
        self.pair = (b1, b2)
        self.ref = (statistics.harmonic_mean([b1.sps, b2.sps]), statistics.fmean([b1.step_s, b2.step_s]))
        self.floor = abs(b1.sps - b2.sps) / statistics.median([b1.sps, b2.sps])

    def get(self, key: Key, k: int) -> Trial:
        trials, order = self.space.table[key], self.order[key]
        while len(order) <= k:
            order.append(int(self.rng.integers(len(trials))))
        return trials[order[k]]

    def singles(self) -> list[Key]:
        return [k for k, v in self.space.table.items() if k.batch == self.space.base.batch and len(v[0].names) <= 1]


def observe(t: Trial, ref: tuple[float, float], source: str = "") -> Observation:
    return observation(t.row, t.key, t.names, status=t.status, samples_per_s=t.sps, base_samples_per_s=ref[0],
                       phases=t.phases, peak_bytes=t.peak, source=source)  # fmt: skip


def base_parts(b1: Trial, b2: Trial) -> tuple[float, float] | None:
    """The baseline's two parts (per-sample, per-step) as shares of its step, over its two runs."""
    shares = []
    for t in (b1, b2):
        if not t.phases or None in t.phases or not t.step_s:
            return None
        data, compute, _optim, step = t.phases
        shares.append(min(1.0, (data + compute) / step))
    a = statistics.fmean(shares)
    return (a, 1.0 - a)


def priced(draw: Draw, epochs: float | None) -> dict:
    """What a live plan prices its trials with, from this draw's study (its single rows and baseline pair): the planned
    run (`epochs` at the baseline's pace) and a trial's seconds fitted to the rows' wall times; nothing unpriced."""
    if not epochs:
        return {}
    measured, (b1, b2) = draw.space, draw.pair
    rows = [
        SimpleNamespace(baseline=False, status=t.status, step_time_s=t.step_s, batch_size=t.key.batch, wall_s=t.wall_s)
        for t in (draw.get(k, 0) for k in draw.singles() if k != measured.base)
    ]
    rows += [SimpleNamespace(baseline=True, status=t.status, step_time_s=t.step_s, batch_size=t.key.batch,
                             wall_s=t.wall_s) for t in (b1, b2)]  # fmt: skip
    epoch = [t.epoch_s for t in (b1, b2) if t.epoch_s]
    if not epoch:
        return {}
    return {"run_s": epochs * statistics.fmean(epoch), "trial_s": trial_seconds(rows)}  # type: ignore[arg-type]


def replay_new(
    draw: Draw, space, valid, max_trials: int, max_rounds: int, epochs: float | None = None
) -> tuple[Search, float]:
    """The search on one draw with at most `max_rounds` repeat rounds, priced where `epochs` is given: what it found and
    the wall seconds of the trials it asked for (beyond the study's single rows and baseline pair, which every search
    starts from)."""
    measured = draw.space
    asked: dict[Key, int] = defaultdict(int, {k: 1 for k in draw.singles()})
    asked[measured.base] = 2
    spent = [0.0]
    start = [observe(draw.get(k, 0), draw.ref) for k in draw.singles() if k != measured.base]
    b1, b2 = draw.pair  # the baseline: its two runs, the reference every time is relative to
    start.append(dataclasses.replace(observe(b1, draw.ref), time=1.0, weight=2.0, parts=base_parts(b1, b2)))

    def next_of(key: Key) -> Trial:
        asked[key] += 1
        t = draw.get(key, asked[key] - 1)
        spent[0] += t.wall_s or 0.0
        return t

    def measure(rows: list[str]) -> list[Observation]:
        keys = [measured.key_of(r) for r in rows]
        return [observe(next_of(k), draw.ref) for k in keys if k in measured.table]

    rounds = [0]

    def repeat(rows: list[str]) -> list[Observation]:  # (a round runs no baseline: timed against the study's)
        rounds[0] += 1
        return [observe(next_of(measured.key_of(r)), draw.ref, f"round {rounds[0]}") for r in rows]

    # (at most `max_rounds` repeat rounds: as if the rest had been measured before)
    how = Searching(space, valid, measured.accum, measure, repeat if max_rounds else None, None, max_trials,
                    rounds_done=max(0, REPEAT_ROUNDS - max_rounds), study_noise=draw.floor,
                    **priced(draw, epochs))  # fmt: skip
    return search(start, how, [math.log(b1.sps / b2.sps) ** 2 / 2]), spent[0]


def replay_old(old, draw: Draw, valid, max_trials: int) -> tuple[Key, int]:
    """The old search (its module `old`) on the same draw: its pick and its trials."""
    measured = draw.space
    asked: dict[Key, int] = defaultdict(int, {k: 1 for k in draw.singles()})
    asked[measured.base] = 2
    sps, step = draw.ref

    def as_old(row: str, t: Trial) -> Any:
        names, batch = split_row(row)
        if t.status != "ok" or not t.sps:
            return old.Measured(row, names, None, None, status=t.status, batch=batch)
        parts = None
        if t.phases and None not in t.phases and t.step_s:
            data, compute, optim, own = (*t.phases[:3], t.step_s)  # (the old search read the mean step)
            per = sps * step / (t.sps * own)
            parts = tuple(per * p / step for p in (data, compute, optim, max(0.0, own - data - compute - optim)))
        return old.Measured(row, names, sps / t.sps, 1.0, parts=parts, batch=batch)

    singles = [as_old(measured.table[k][0].row, draw.get(k, 0)) for k in draw.singles() if k != measured.base]
    singles.append(old.Measured("baseline", frozenset(), 1.0, 1.0))

    def measure(rows: list[str]) -> list[Any]:
        out = []
        for r in rows:
            k = measured.key_of(r)
            if k not in measured.table:
                out.append(old.Measured(r, *split_row(r)[:1], None, None, status="not in the study"))
                continue
            asked[k] += 1
            out.append(as_old(r, draw.get(k, asked[k] - 1)))
        return out

    top = max(k.batch for k in measured.table)

    def next_batch(batch: int | None) -> int | None:
        bigger = 2 * (batch or measured.base.batch)
        return bigger if bigger <= top else None

    found = old.search(singles, measure, valid, list(strategies.REGISTRY), noise=draw.floor, max_trials=max_trials,
                       next_batch=next_batch)  # fmt: skip
    return (measured.key_of(found.incumbent) if found.incumbent else measured.base), found.trials


def old_policy(rev: str) -> Any:
    text = subprocess.run(["git", "show", f"{rev}:trainwise/search/policy.py"], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parent).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_policy.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_policy", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_policy"] = module
    spec.loader.exec_module(module)
    return module


def summary(ratios: list[float], trials: list[int], size: int) -> str:
    ratios = sorted(ratios)
    p90 = ratios[min(len(ratios) - 1, math.ceil(0.9 * len(ratios)) - 1)]
    t = statistics.median(trials)
    return f"median {statistics.median(ratios):.3f} p90 {p90:.3f} trials {t:g} of {size} (max {max(trials)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path)
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--max-trials", type=int, default=8, help="the search's trials at most (plan's default)")
    ap.add_argument("--old", default="3a936b5", help="the commit whose search/policy.py is the old search")
    ap.add_argument("--no-old", action="store_true")
    ap.add_argument("--no-repeats", action="store_const", const=0, dest="max_rounds", default=REPEAT_ROUNDS,
                    help="the new search without its repeat rounds (--max-rounds 0)")  # fmt: skip
    ap.add_argument("--max-rounds", type=int, default=REPEAT_ROUNDS, choices=range(REPEAT_ROUNDS + 1),
                    help=f"the new search's repeat rounds at most (its own: {REPEAT_ROUNDS}); with --max-trials, a "
                    "smaller budget: what the pick loses on fewer trials")  # fmt: skip
    ap.add_argument("--run-epochs", type=float, default=None,
                    help="price the new search's trials as a live plan does: the planned run is this many epochs of "
                    "the study's data at the baseline's pace, a trial's seconds fitted to the rows' wall times "
                    "(default: unpriced)")  # fmt: skip
    ap.add_argument("--save", type=Path, default=None,
                    help="write the space's trials to this JSON file (benchmarks/spaces/NAME.json: a replay reads it "
                    "as STUDY), then replay")  # fmt: skip
    ap.add_argument("--by-round", action="store_true",
                    help="take each round's common drift out of the space first (a host that sped up between rounds "
                    "reads as noise otherwise): every trial's pace over its round's median factor")  # fmt: skip
    ap.add_argument("--show", type=int, default=0, help="print the new search's trials on the first N draws")
    ap.add_argument("--show-worse", type=float, default=math.inf, help="and on each draw whose pick is this far off")
    args = ap.parse_args()
    measured = Measured.load(args.study)
    if args.save:
        measured.save(args.save, str(args.study))
        print(f"saved {sum(map(len, measured.table.values()))} trials of {len(measured.table)} rows to {args.save}")
    if args.by_round:
        measured, factors = measured.by_round()
        print(f"by round: each round's pace over the rows' mean {', '.join(f'{f:.3f}' for f in factors)}, taken out")
    study_batch = measured.base.batch
    pool = sorted({n for v in measured.table.values() for n in v[0].names}, key=list(strategies.REGISTRY).index)
    valid = validity(measured.task, measured.accum, {"bf16"}, frozenset(pool))
    space = build_space(pool, valid, study_batch, sorted({k.batch for k in measured.table}), measured.accum)
    space.choices = {k: c for k, c in space.choices.items() if k in measured.table}  # what was measured is the space
    truth = measured.truth()
    best = min(truth[k] for k in space.choices)
    best_row = next(c.row for k, c in space.choices.items() if truth[k] == best)
    old = None if args.no_old else old_policy(args.old)
    new_ratios, new_trials, old_ratios, old_trials = [], [], [], []
    # priced: the search's trials plus the planned run at its pick's true pace, over the planned run at the true
    # best's (an oracle that knew the best for free), for the priced search and the unpriced one on the same draws
    run_s = (args.run_epochs or 0) * statistics.fmean(t.epoch_s or 0.0 for t in measured.table[measured.base])
    totals: dict[str, list[float]] = {"priced": [], "unpriced": []} if run_s else {}
    for d in range(args.draws):
        draw = Draw(measured, d)
        found, spent = replay_new(draw, space, valid, args.max_trials, args.max_rounds, args.run_epochs)
        pick = measured.key_of(found.incumbent) if found.incumbent else measured.base
        if d < args.show or truth[pick] / best > args.show_worse:
            show(d, found, measured, truth)
        new_ratios.append(truth[pick] / best)
        new_trials.append(found.trials + found.repeats)
        if run_s:
            totals["priced"].append((spent + run_s * truth[pick]) / (run_s * best))
            plain, plain_spent = replay_new(Draw(measured, d), space, valid, args.max_trials, args.max_rounds)
            plain_pick = measured.key_of(plain.incumbent) if plain.incumbent else measured.base
            totals["unpriced"].append((plain_spent + run_s * truth[plain_pick]) / (run_s * best))
        if old is not None:
            key, n = replay_old(old, Draw(measured, d), valid, args.max_trials)
            old_ratios.append(truth.get(key, math.inf) / best)
            old_trials.append(n)
    beyond = len([k for k in space.choices if k not in Draw(measured, 0).singles()])
    print(f"study {args.study}: {len(space.choices)} candidates ({beyond} beyond the baseline and single rows), "
          f"true best {best_row} at {best:.1%}; {args.draws} draws")  # fmt: skip
    if old is not None:
        print(f"old search ({args.old}): {summary(old_ratios, old_trials, beyond)}")
    for how, total in totals.items():
        total.sort()
        p90 = total[min(len(total) - 1, math.ceil(0.9 * len(total)) - 1)]
        print(f"{how}: search trials + a {args.run_epochs:g}-epoch run ({run_s:.0f} s at the baseline's pace) over "
              f"that run at the true best's pace: median {statistics.median(total):.3f} p90 {p90:.3f}")  # fmt: skip
    print(f"new search{' (priced)' if run_s else ''}: {summary(new_ratios, new_trials, beyond)}")


def show(d: int, found: Search, measured: Measured, truth: dict[Key, float]) -> None:
    for c in found.candidates:
        meas = f"{c.measured_time:.1%}" if c.measured_time is not None else "-"
        print(f"  draw {d} trial {c.trial}: {c.row:50s} predicted {c.predicted_time:.1%} [{c.predicted_low:.1%}, "
              f"{c.predicted_high:.1%}] measured {meas} (true {truth.get(measured.key_of(c.row), math.nan):.1%}): "
              f"{c.reason}")  # fmt: skip
    pick = truth[measured.key_of(found.incumbent or "baseline")]
    said = f"noise {found.noise:.3f}, model error {found.model_error:.3f}, {found.repeats} repeats"
    print(f"  draw {d}: pick {found.incumbent} (true {pick:.1%}), fastest {found.fastest}, {said}; {found.stopped}")


if __name__ == "__main__":
    main()
