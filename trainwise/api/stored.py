"""Studies on disk, as the verbs read them: their results and advice, the quality phase's verdicts, memory and batch
hints from the estimate, and a study's row as a trial spec for `train --plan` (below the verbs: `Study`, advise and
train use it). The ranking itself is `trainwise.search.ranking` (pure)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.core.results import StudyRow
from trainwise.estimating.basis import estimate_basis, price
from trainwise.estimating.peak import largest_batch, target_length
from trainwise.estimating.probe import calibrate
from trainwise.estimating.shapes import shape_of
from trainwise.search.ranking import Advice, Constraints, needs, pick, with_quality
from trainwise.search.ranking import advise as rank
from trainwise.spec.config import TrialSpec
from trainwise.strategies.knobs import TrialPlan
from trainwise.study.store import Store, check_ours, partial_note, read_quality, read_results


def advise_study(
    studies: Path | list[Path], constraints: Constraints, on_probe: Callable[[int, int], None] | None = None
) -> Advice:
    """advise on a study's results (with the quality phase's verdicts when it ran), or on several studies'
    rows side by side (named STUDY/row: the same model measured on other devices or at other prices, where
    cost ranks differently from time); with a memory budget, each memory-saving row gets a batch hint."""
    paths = [studies] if isinstance(studies, Path) else list(studies)
    names = [p.resolve().name or str(p) for p in paths]
    labels = names if len(set(names)) == len(names) else [str(p) for p in paths]
    rows: list[StudyRow] = []
    notes: list[str] = []
    hints: dict[str, str] = {}
    machines = []  # a study of several: what its rows were measured on and priced at
    for path, label in zip(paths, labels, strict=True):
        own = read_results(path)
        machines.append(_study_line(label, own))

        def named(n: str, label: str = label) -> str:
            return n if len(paths) == 1 else f"{label}/{n}"

        if (verdicts := read_quality(path)) is not None:
            own, note = with_quality(own, verdicts)
            notes.append(note if len(paths) == 1 else f"{label}: {note}")
        if constraints.memory_budget_bytes is not None:
            budget = constraints.memory_budget_bytes
            hints |= {named(k): h for k, h in batch_hints(path, own, budget, on_probe).items()}
        basis = quality_basis(path)
        rows += [dataclasses.replace(r, strategy=named(r.strategy), **_unset(r, basis)) for r in own]
    result = rank(rows, constraints)
    result.notes[:0] = notes
    if len(paths) > 1:
        result.notes.insert(0, "rows of " + "; ".join(machines))
    judged = {r.strategy: r.quality_verdict for r in rows if r.quality_verdict}
    result.verdicts = [
        dataclasses.replace(v, reason=f"{v.reason}; quality: {judged[v.strategy]}") if v.strategy in judged else v
        for v in result.verdicts
    ]
    result.verdicts = [
        dataclasses.replace(v, reason=f"{v.reason}; {hints[v.strategy]}") if v.strategy in hints else v
        for v in result.verdicts
    ]
    return result


def _stored_spec(study: Path):
    """A trial spec from the study's store, the baseline's where it has one (its batch is the study's; a plan's
    `row@bsN` runs at its own); None when it has no store or no trial."""
    return Store.spec_of(study, "STUDY", "baseline")


def _unset(row: StudyRow, values: dict) -> dict:
    """The values for the row's fields it does not have (None)."""
    return {k: v for k, v in values.items() if getattr(row, k) is None}


def quality_basis(study: Path) -> dict:
    """What a study's short-trial quality rests on (StudyRow's trial_steps and eval_samples): its trials'
    steps and how many held-out rows scored them ({} when the study's store cannot say)."""
    spec = _stored_spec(study)
    if spec is None:
        return {}
    s = spec.settings
    held = Path(s.data_dir) / "eval.jsonl"
    n = min(s.eval_samples, len(held.read_text(encoding="utf-8").splitlines())) if held.is_file() else s.eval_samples
    return {"trial_steps": spec.steps, "eval_samples": n}


def _study_line(label: str, rows: list[StudyRow]) -> str:
    """'a: Intel Xeon (cpu), $0.1/h' for a study of several: what its rows were measured on and priced at."""
    row = next((r for r in rows if r.status == "ok"), None)
    env = (row.env if row else None) or {}
    price = ((row.cost_note if row else None) or "unpriced").split(",")[0].split(";")[0]
    device = env.get("device", "?")
    if device == "cpu" and env.get("torch_threads"):
        device = f"cpu, {env['torch_threads']} thread" + ("s" if env["torch_threads"] > 1 else "")
    return f"{label}: {env.get('device_name', '?')} ({device}), {price}"


def memory_estimates(
    study: Path, rows: list[StudyRow], on_probe: Callable[[int, int], None] | None = None
) -> tuple[dict[str, dict], list[str]]:
    """Each ok row's memory as `trainwise estimate` predicts it (row -> MemoryEstimate as a dict), at the row's own
    batch size and the study's lengths, on its model and device; and a line per row it could not price. Nothing
    when the study's model cannot be built here (a hub id offline): the one line says so."""
    found = estimate_basis(study)
    if found is None:
        return {}, [f"{study}: its model cannot be built here (or it has no trial), so nothing is estimated"]
    if found[0].device == "cuda" and not _has_cuda():
        return {}, [f"{study} was measured on cuda: its estimate calibrates there, and this machine has no GPU"]
    estimates, missed = {}, []
    for row in rows:
        if row.status != "ok" or row.plan is None:
            continue
        batch = row.batch_size or found[0].batch_size
        try:
            est = price(found, TrialPlan.from_dict(row.plan), batch, on_probe)
        except ConfigError as e:  # a plan the estimate does not model: said, the other rows are drawn
            missed.append(f"{row.strategy}: {e}")
            continue
        except (ValueError, ImportError, RuntimeError) as e:  # a package or shape this machine lacks: the same
            missed.append(f"{row.strategy}: {type(e).__name__}: {e}")
            continue
        # what it was made for: the page draws it only beside that row (not one a --replace put in its place)
        estimates[row.strategy] = {**est.to_dict(), "for_row": {"batch_size": batch, "plan": row.plan}}
    return estimates, missed


def _has_cuda() -> bool:
    import torch  # heavy: torch

    return torch.cuda.is_available()


def batch_hints(
    study: Path, rows: list[StudyRow], budget: int, on_probe: Callable[[int, int], None] | None = None
) -> dict[str, str]:
    """Per row that lets a larger batch fit than the baseline does: up to which batch each fits the budget
    (so when the row is needed), from `trainwise estimate` on the study's model and lengths. Empty when the
    study's model cannot be built here (a hub id offline), since the hints add to the measured advice."""
    found = estimate_basis(study)
    if found is None:
        return {}
    s, config, overhead = found
    target = target_length(s.task, s.max_length, s.max_target_length)

    def estimate_of(plan: TrialPlan):
        peak = price(found, plan, s.batch_size, on_probe)
        cal, shape = calibrate(config, s.task, plan, s.device, on_probe), shape_of(config, s.task, plan)  # cached
        fits = largest_batch(shape, cal, plan, budget, s.max_length, target, s.device, overhead)
        return peak.peak_bytes, fits

    def measured_fit(row: StudyRow | None) -> bool:  # a row measured within the budget at the study's batch
        return bool(row and row.status == "ok" and row.peak_mem_bytes and needs(row) <= budget)

    # a measurement outranks the estimate: a row measured to fit at the study's batch fits up to at least it
    base_row = next((r for r in rows if r.baseline), None)
    base_peak, baseline = estimate_of(TrialPlan())
    baseline = max(baseline, s.batch_size) if measured_fit(base_row) else baseline
    hints = {}
    for row in rows:
        if row.baseline or row.status != "ok" or not row.plan:
            continue
        peak, own = estimate_of(TrialPlan.from_dict(row.plan))
        own = max(own, s.batch_size) if measured_fit(row) else own
        if peak >= 0.99 * base_peak:
            continue  # no memory saving the estimate can see at the study's batch
        if baseline >= s.batch_size:
            hints[row.strategy] = f"not needed for memory at batch {s.batch_size}: baseline fits up to ~{baseline}"
        elif own == 0:
            hints[row.strategy] = "does not fit the budget at any batch (estimate)"
        else:
            hint = f"fits up to ~{own}" if baseline == 0 else f"only needed when batch > {baseline}; fits up to ~{own}"
            hints[row.strategy] = f"{hint} (estimate)"
    return hints


def study_spec(
    study: Path, name: str | None, on_note: Callable[[str], None], out: Path | None = None, force: bool = False
) -> TrialSpec:
    """A compare study's trial spec for a row (default: advise's pick), for `train --plan`: the study's
    model, data, batch, lengths, lr and seed, as its trial ran them. `out`: the run's, checked as
    prepare_study checks it on the other path."""
    if out is not None:
        check_ours(out, force)

    partial = partial_note(study)
    if partial:
        on_note(f"trainwise: note: {partial}")
    store = Store.of(study, "--plan")
    try:
        entry = pick(read_results(study), name, f"--plan {study}")
        if name is None:
            on_note(f"trainwise train: {entry.strategy!r}, the plan advise recommends in {study}")
        spec = store.spec(entry.row_text)
    finally:
        store.close()
    if spec is None:
        raise ConfigError(f"--plan {study}: the store holds no trial of {entry.strategy!r}")
    if entry.batch_size is not None:  # the cell's own batch size and workers (a sweep's cells share a row)
        workers = entry.workers if entry.workers is not None else spec.settings.num_workers
        settings = dataclasses.replace(spec.settings, batch_size=entry.batch_size, num_workers=workers)
        spec = dataclasses.replace(spec, settings=settings)
    return spec


def pricer(study: Path, accum: int) -> Callable[[frozenset[str], int], float | None]:
    """`trainwise estimate`'s peak (tensors + runtime) of a combination of strategies at a batch size, on the study's
    model and lengths; None where it cannot say (a model it cannot build here, a plan it does not model). The
    estimate's basis is built on first use, and each figure once."""
    cache: dict = {}

    def of(names: frozenset[str], batch: int) -> float | None:
        if "basis" not in cache:
            cache["basis"] = estimate_basis(study)
        key = (names, batch)
        if cache["basis"] is not None and key not in cache:
            order = list(strategies.REGISTRY)
            text = "+".join(sorted(names, key=lambda n: order.index(n.partition("=")[0]))) or "baseline"
            try:
                est = price(cache["basis"], strategies.parse_row(text, accum).plan, batch)
                cache[key] = est.peak_bytes + est.overhead_bytes
            except ConfigError:  # a plan the estimate does not model (or a row refused since): measured, not priced
                cache[key] = None
        return cache.get(key)

    return of
