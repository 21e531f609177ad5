"""`trainwise plan` as a call. It orchestrates; the method is `trainwise.search`:

1. the single rows (a study given with --study, or compare's rows run first), the ecosystem's default (at its own
   batch size where the data allows) and each of its strategies alone, as rows of one study;
2. the search (`search.acquisition` over `search.model`, fed by `search.plan_inputs`): each trial a row of the same
   study, each repeat round a study of its own in OUT/repeats/N (its two rows, no baseline run);
3. the pick's quality against the baseline over paired seeds (`search.verdicts`), falling back in order;
4. OUT/plan.json, OUT/plan.md (`report.plan`) and the study's report.html drawn again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.api import compare as compare_api
from trainwise.api import from_config, from_objects
from trainwise.api.options import CompareOptions, PlanOptions, words
from trainwise.api.render import STDERR, Render
from trainwise.core.errors import ConfigError
from trainwise.core.files import write_atomic
from trainwise.core.quality import INCONCLUSIVE
from trainwise.core.results import StudyRow
from trainwise.core.units import parse_seconds
from trainwise.report.plan import headline, markdown
from trainwise.search import ecosystem
from trainwise.search import plan_inputs as inputs
from trainwise.search.acquisition import Candidate, Search, Searching, search
from trainwise.search.model import MemoryModel
from trainwise.search.plan_result import Context, PlanResult, check_note, summarize
from trainwise.search.ranking import Constraints, advise, one_kind
from trainwise.search.verdicts import MAX_SEEDS, MIN_SEEDS, NO_VERDICT, WORSE
from trainwise.study.store import PAGE, PLAN, PLAN_MD, Store, write_report

REPEATS = "repeats"  # OUT/repeats/N: the N-th round of repeats, a study of its own
MAX_CHECKS = 3  # candidates whose quality is checked, in turn, before no plan is recommended


def plan(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> PlanResult:
    """`trainwise plan` in Python: the CLI's options as keyword arguments (over a study file's). Returns the
    PlanResult (`.plan`, `.lines`, `.strategies` with their reasons, `.search`), also in OUT/plan.json. Your own
    training as objects: `trainer=` (a Trainer / SFTTrainer), or `model=` (a model object) with `train_dataset=`,
    `processing_class=` and `args=`; the plan then also comes back as `.args` (your arguments' class) and
    `.data_collator` (`trainwise.api.from_objects`)."""
    objects = from_objects.pop_objects(options)
    if objects is not None:
        return from_objects.plan(objects, options, config, render, start)
    return start(PlanOptions.of(options, config), render, given=set(options))


def start(
    options: PlanOptions, render: Render | None = STDERR, given: set[str] | None = None, objects: bool = False
) -> PlanResult:
    """`given`: the options the caller named (a flag or a keyword wins over --from-config's file); `objects`: the
    file is a caller's objects saved by `trainwise.api.from_objects` (they train in the caller's process)."""
    render = Render.of(render)
    began = time.monotonic()
    yours = None
    constraints = options.constraints()  # the limits checked before a file is read (it sets none of them)
    if options.from_config:  # the user's own config: the study's settings, and a row of it
        options, yours = from_config.prepare(options, given, objects)
        for line in yours.notes:
            render.note(f"trainwise plan: {line}")
    budget_s = parse_seconds(options.max_search_time, "--max-search-time") if options.max_search_time else None
    base = options.compare_options()
    cfg0 = base.resolve()[0]
    if cfg0.batch_sizes or len(cfg0.num_workers) > 1:
        raise ConfigError(
            "plan searches at one batch size and worker count: leave out --batch-sizes and a --num-workers list"
        )
    only, never = options.combining()
    out = Path(base.out)
    from trainwise.api import stored  # heavy: the estimate (torch, transformers), built on first use
    from trainwise.study.prepare import resolve_device, too_slow  # heavy: study.prepare loads numpy (and torch)

    device, caps = resolve_device(cfg0.device)
    task, accum, batch = cfg0.task, cfg0.accum_steps, cfg0.batch_size
    rows0 = [r.strip() for r in words(base.strategies)]
    extra: list[str] = []
    if options.study is None and _default_rows(options):
        extra += [r for r in strategies.default_rows(task, device) if r not in rows0]
    runnable = inputs.validity(task, accum, caps)
    slow = too_slow(["bf16", "fp16", "bf16_pure"], device, caps) if options.ecosystem_default else {}

    def eco_valid(row: str) -> str | None:  # (a precision this device only emulates: recorded, as a default row is)
        names = inputs.split_row(row)[0]
        return runnable(names) or next((slow[n] for n in names if n in slow), None)

    eco = ecosystem.default_for(task, device, eco_valid) if options.ecosystem_default else None
    if eco is not None and eco.row != "baseline":
        extra += _alone(eco.row)  # each of its strategies alone: the search can take one out of it, or add one
    if yours is not None and yours.row != "baseline":
        extra += [yours.row, *_alone(yours.row)]
    base = dataclasses.replace(base, strategies=[*rows0, *dict.fromkeys(r for r in extra if r not in rows0)])
    shown: list[Any] = []  # the last table a compare call drew: printed once, at the end
    said: set[str] = set()

    def once(line: str) -> None:  # a note each round's compare repeats (the model's, the data's) is said once
        if line not in said:
            said.add(line)
            render.note(line)

    quiet = dataclasses.replace(render, table=shown.append, note=once)
    compare_api.start(base, quiet)  # the single rows: run, or resumed from the store
    current = [r.row_text for r in study_rows(out)]
    eco_row, eco_notes = None, tuple[str, ...]()
    if eco is not None and eco.row != "baseline":  # at the library's own batch, where the data holds it
        n_train = _n_train(out)
        own = eco.batch if eco.batch and n_train is not None and eco.batch <= n_train else batch
        eco_row = eco.row if own == batch else f"{eco.row}@bs{own}"
        eco_notes = (*eco.notes, *ecosystem.overridden(eco, cfg0.max_length, cfg0.lr or 0.0, own))
        if eco_row not in current:
            current.append(eco_row)
            compare_api.start(dataclasses.replace(base, strategies=current), quiet)
    singles_s = time.monotonic() - began
    quiet = dataclasses.replace(quiet, progress=_new_only(render.progress))
    rows = study_rows(out)
    base_sps = next((r.samples_per_s for r in rows if r.baseline and r.status == "ok" and r.samples_per_s), None)
    if base_sps is None:
        raise ConfigError(
            f"{out} has no baseline row that finished ok: the search measures every combination against it "
            "(add baseline to the study's rows)"
        )
    valid = inputs.validity(task, accum, caps, only, never, yours.always if yours else frozenset())
    run_s = _run_seconds(rows, options.run_epochs)

    def observe(found: list[StudyRow], source: str = "") -> list[inputs.Observation]:
        judged = study_rows(out) if source else found  # a round (no baseline run): the study's verdicts and baseline
        why = {v.strategy: v.reason for v in advise(judged, constraints).verdicts if not v.feasible}
        return inputs.observations(
            found, accum, batch, {r.row_text: why[r.strategy] for r in found if r.strategy in why}, source, base_sps
        )

    start_obs = observe(rows) + _repeated(out, observe)
    if not any(o.feasible for o in start_obs):
        why = next((f"{o.row}: {o.why_not}" for o in start_obs if o.ok and o.why_not), "no row finished ok")
        raise ConfigError(f"no row of {out} meets the constraints, so there is nothing to combine ({why})")
    sizes = inputs.ladder(batch, _n_train(out)) if options.batch_search else (batch,)
    measured = [o for o in start_obs if options.batch_search or o.key.batch == batch]
    space = inputs.build_space(inputs.pool(start_obs), valid, batch, sizes, accum, measured)

    def measure(new: list[str]) -> list[inputs.Observation]:
        render.note(f"trainwise plan: measuring {', '.join(new)}")
        current.extend(r for r in new if r not in current)
        compare_api.start(dataclasses.replace(base, strategies=current), quiet)
        return [o for o in observe(study_rows(out)) if o.row in new]

    done = _repeat_dirs(out)
    rounds = max((int(p.name) for p in done), default=0)

    def repeat(leaders: list[str]) -> list[inputs.Observation]:
        nonlocal rounds
        rounds += 1
        where = out / REPEATS / str(rounds)
        render.note(f"trainwise plan: measuring again ({where}): {', '.join(leaders)}")
        again = dataclasses.replace(base, out=str(where), strategies=list(leaders), repeat=1, remeasure=False)
        compare_api.start(again, dataclasses.replace(quiet, table=lambda _t: None))  # (the study's table is shown)
        return [o for o in observe(study_rows(where), f"{REPEATS}/{rounds}") if o.row in leaders and o.names]

    def context(found: Search) -> Context:
        setting = Store.spec_of(out)
        return Context(
            out,
            study_rows(out),
            found,
            batch,
            valid,
            only,
            never,
            constraints.memory_budget_bytes,
            eco_row,
            eco.to_dict() if eco is not None else None,
            eco_notes,
            run_s,
            options.run_epochs,
            setting is not None and setting.settings.model_kind == "preset",
            yours.row if yours else None,
        )

    def on_trial(found: Search, c: Candidate) -> None:
        said = f"{c.measured_time:.1%}" if c.measured_time is not None else c.note or c.state
        render.note(f"trainwise plan: trial {c.trial}: {c.row} measured {said} (predicted {c.predicted_time:.1%})")
        progress = summarize(context(found), None)  # a killed search resumes from this record and budget
        progress.rejected = f"the search is still running ({found.trials} of at most {options.max_trials} trials)"
        write_atomic(out / PLAN, json.dumps({**progress.to_dict(), "in_progress": True}, indent=1))

    how = Searching(
        space, valid, accum, measure, repeat, MemoryModel(stored.pricer(out, accum), _capacity(device, constraints)),
        options.max_trials, None if budget_s is None else max(0.0, budget_s - (time.monotonic() - began)),
        run_s=run_s, trial_s=inputs.trial_seconds(rows), earlier=_searched_before(out), rounds_done=len(done),
        study_noise=next((r.noise_floor for r in rows if r.baseline and r.noise_floor is not None), None),
        references=tuple(r for r in (eco_row, yours.row if yours else None) if r), on_trial=on_trial,
    )  # fmt: skip
    found = search(start_obs, how, inputs.deviations(rows))
    if shown:
        render.table(shown[-1])  # the study's whole table, once
    ctx = context(found)
    result = summarize(ctx, found.incumbent)
    result.singles_s = singles_s
    checked = time.monotonic()
    if options.quality_check and result.plan and result.plan != "baseline":
        result = _checked(options, base, ctx, result, render)
    result.quality_s = time.monotonic() - checked
    result.versus_default = found.versus.get(eco_row or "", {}).get(result.plan or "")
    if yours is not None:
        say = lambda line: render.note(f"trainwise plan: {line}")  # noqa: E731 (a note of this verb's)
        from_config.finish(yours, result, found.versus.get(yours.row, {}), cfg0, device, options, say)
    plan_line = next((ln for ln in result.lines if ln.label == "plan"), None)
    if plan_line and plan_line.epoch_time_s:
        result.search_share_of_epoch = found.wall_s / plan_line.epoch_time_s
    result.headline = headline(result.to_dict())
    write_atomic(out / PLAN, json.dumps(result.to_dict(), indent=1))
    write_atomic(out / PLAN_MD, markdown(result.to_dict()))
    from trainwise.api.report import render as draw  # heavy: the page's figures (matplotlib)

    try:  # the study's page again, with the search's figure
        write_report(out, out / PAGE, draw(out, "html"))
    except ConfigError as e:  # another command took the study meanwhile: the plan stands, its page waits
        render.note(f"trainwise plan: report.html not drawn again ({e}); `trainwise report {out}` draws it")
    return result


def _checked(
    options: PlanOptions, base: CompareOptions, ctx: Context, result: PlanResult, render: Render
) -> PlanResult:
    """The pick's quality against the baseline over paired seeds, tested sequentially; where it is worse, the next
    candidates in turn (MAX_CHECKS in all): the next-fastest that the options allow, never a superset of a rejected
    row, the ecosystem's default last. A check that learned nothing is said, never a pass, and ends the checks (a
    longer --quality-steps is what it needs)."""
    found = ctx.found
    ranked = sorted(found.times, key=lambda r: found.times[r][0])
    order = [result.plan] + [r for r in ranked if r != result.plan and r != ctx.eco_row]
    order = [r for r in order if r and r != "baseline" and found.times.get(r, [1.0])[0] < 1.0]
    if ctx.eco_row and ctx.eco_row not in order[:1] and ctx.eco_row in found.times:
        order.append(ctx.eco_row)
    checks: list[dict] = []
    rejected: list[tuple[frozenset[str], int]] = []
    for row in (r for r in order if r):
        if len(checks) >= MAX_CHECKS:
            break
        names, size = inputs.split_row(row)
        size = size or ctx.study_batch
        if any(names >= n and size >= b for n, b in rejected):
            continue
        q = _quality(options, base, ctx, row, render)
        check = (q or {}).get("check") or {}
        verdict = check.get("verdict")
        passed = verdict not in (None, WORSE, NO_VERDICT)
        why = "" if passed else f"{row}: {check.get('said') or 'no trial of its check finished'}"
        checks.append({"row": row, "quality": q, "passed": passed, "why": why})
        if passed:
            new = result if row == result.plan else summarize(ctx, row)
            new.singles_s = result.singles_s
            new.quality, new.checked = q, checks
            if row != result.plan:
                new.notes.append(
                    f"{len(checks) - 1} faster candidate(s) lost quality: {row} is the fastest that keeps it"
                )
            return new
        render.note(f"trainwise plan: quality check: {why}")
        if verdict == NO_VERDICT:
            break  # the next check would learn as little
        rejected.append((names, size))
    said = "; ".join(c["why"] for c in checks) or "no candidate faster than the baseline to check"
    if checks and checks[-1]["quality"] and (checks[-1]["quality"].get("check") or {}).get("verdict") == NO_VERDICT:
        said += "; a longer check (--quality-steps) can decide, or --no-quality-check plans on speed alone"
    result.quality, result.checked, result.rejected = (checks[0]["quality"] if checks else None), checks, said
    result.notes.append(said)
    result.commands = []
    result.lines = [
        dataclasses.replace(ln, label="fastest, not recommended") if ln.label == "plan" else ln for ln in result.lines
    ]
    result.plan = None
    return result


def _quality(options: PlanOptions, base: CompareOptions, ctx: Context, row: str, render: Render) -> dict | None:
    """`row` against the baseline, trained longer with paired seeds (the same seeds for both), one pair more at a
    time from MIN_SEEDS while the check is undecided, up to MAX_SEEDS. The row trains on as many samples as the
    baseline (by what a step of each carries), at the rate a user would scale it to."""
    from trainwise.search import verdicts as quality  # heavy: numpy (the statistics)
    from trainwise.study.prepare import prepare_study  # heavy: trainwise.study.prepare loads numpy (and torch)
    from trainwise.study.run import run_study, unstored  # heavy: trainwise.study.run loads numpy
    from trainwise.training.job import launch  # heavy: the trial machinery, only when a check runs

    steps = options.quality_steps or 4 * (base.max_steps or 16)
    cfg = base.resolve()[0]
    carried = {r.row_text: r.samples_per_s * r.step_time_s for r in ctx.rows if r.samples_per_s and r.step_time_s}
    base_carried = next((carried.get(r.row_text) for r in ctx.rows if r.baseline), None)
    ratio = {k: v / base_carried for k, v in carried.items()} if base_carried else {}
    seeds = max(MIN_SEEDS, options.seeds)
    last = max(seeds, MAX_SEEDS)
    while True:
        prepared = prepare_study(quality.quality_config(cfg, ["baseline", row], steps, seeds))
        rules = quality.equal_samples(prepared, ratio)
        new = [(t.row, t.steps or steps) for t in unstored(prepared)]  # (an earlier check's baseline is stored)
        render.note(check_note(ctx, row, steps, seeds, new, base.max_steps or 16))
        with render.progress(prepared) as (on_event, on_done):
            trials = run_study(prepared, launch, on_event, on_done)
        rows = quality.verdicts(trials, False)
        mine = next((q for q in rows if q.strategy == row), None)
        theirs = next((q for q in rows if q.verdict == "reference"), None)
        if mine is None or theirs is None:
            return None
        check = quality.paired_check(mine, theirs, options.max_quality_drop)
        if check.verdict != INCONCLUSIVE or seeds >= last:
            return {**mine.to_dict(), "lr_rule": rules.get(row, ""), "check": check.to_dict()}
        seeds += 1


def _repeated(out: Path, observe: Callable[..., list[inputs.Observation]]) -> list[inputs.Observation]:
    """What earlier repeat rounds of this search measured (OUT/repeats/N), timed against the study's baseline."""
    found = []
    for where in _repeat_dirs(out):
        try:
            found += [o for o in observe(study_rows(where), f"{REPEATS}/{where.name}") if o.names]
        except ConfigError:
            continue
    return found


def _repeat_dirs(out: Path) -> list[Path]:
    root = out / REPEATS
    return sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)) if root.is_dir() else []


def _new_only(progress: Callable) -> Callable:
    """A study's progress that leaves out the trials read back from its store."""

    @contextlib.contextmanager
    def shown(prepared: Any) -> Iterator[tuple[Callable, Callable]]:
        with progress(prepared) as (on_event, on_done):
            yield on_event, lambda spec, result, stored: None if stored else on_done(spec, result, stored)

    return shown


def _alone(row: str) -> list[str]:
    """A combination's strategies as rows of their own (one that runs only beside another, cce, is left out: its
    effect is read off the combination)."""
    names = [n.strip() for n in row.partition("@bs")[0].split("+")]
    return [n for n in names if n and n != "baseline" and not strategies.REGISTRY[n.partition("=")[0]].with_one_of]


def _capacity(device: str, constraints: Constraints) -> int | None:
    """The memory a plan may fill: --memory-budget, or on a GPU the device's when smaller (None on a CPU without a
    budget: its RAM does not bind a batch the way a GPU's memory does)."""
    budget = constraints.memory_budget_bytes
    if device != "cuda":
        return budget
    import torch  # heavy: torch

    total = int(torch.cuda.get_device_properties(0).total_memory)
    return min(total, budget) if budget else total


def _n_train(out: Path) -> int | None:
    spec = Store.spec_of(out)
    return spec.settings.n_train if spec is not None else None


def _default_rows(options: PlanOptions) -> bool:
    """Whether the plan runs the default rows (--strategies not given)."""
    given = [r.strip() for r in words(options.strategies)]
    return given == list(strategies.DEFAULT_ROWS) or given == list(strategies.default_rows(options.task))


def _run_seconds(rows: list[StudyRow], epochs: float) -> float | None:
    """The planned run at the baseline's pace, in seconds (what a one-time cost is charged against)."""
    base = next((r for r in rows if r.baseline and r.status == "ok" and r.epoch_time_s), None)
    return base.epoch_time_s * epochs if base is not None and base.epoch_time_s else None


def _searched_before(out: Path) -> list[Candidate]:
    """The trials an earlier `trainwise plan` in `out` measured (its plan.json): they stay in the search's record
    and count against its budget (a resumed search's budget is the search's, not a run's)."""
    try:
        earlier = json.loads((out / PLAN).read_text())["search"]["candidates"]
        known = {f.name for f in dataclasses.fields(Candidate)}
        return [Candidate(**{k: v for k, v in c.items() if k in known}) for c in earlier if c.get("trial")]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def study_rows(out: Path) -> list[StudyRow]:
    """The study's rows the search reads: on a cluster of several device kinds, those of one kind (advise's)."""
    from trainwise.study.store import read_results  # heavy: trainwise.study.store

    return one_kind(read_results(out))[0]
