"""The strategy catalogue: every knob and strategy, the row parser, and the one walk of the knobs per seam.

A row ("bf16+grad_ckpt", "freeze_layers=4", "all") is parsed once, by `parse_row`, into a `Row`
(its strategies, their values and the plan). `runtime`, `export_doc` and `memory_terms` are the only
code that walks the knobs: the loop, export and estimate each call one of them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from trainwise.core.errors import ConfigError
from trainwise.strategies import batching, freezing, lm, memory, optim, precision, scale
from trainwise.strategies.base import (
    ALL_TASKS,
    NA,
    PACKAGE_EXTRAS,
    ExportDoc,
    MemoryTerms,
    Probed,
    Runtime,
    Strategy,
    Support,
)
from trainwise.strategies.knobs import KNOBS, TrialPlan

if TYPE_CHECKING:
    from trainwise.core.device import DeviceFacts

T = TypeVar("T")
BASELINE = Strategy("baseline", "vanilla fp32, AdamW, pad to max length; the 100% row")


def _symmetric(entries: list[Strategy]) -> dict[str, Strategy]:
    """A conflict declared on either side applies both ways (ZeRO-Offload lists the optimizers it
    replaces; they need not list it back)."""
    registry = {s.name: s for s in entries}
    for s in entries:
        for other in s.conflicts:
            o = registry[other]
            registry[other] = dataclasses.replace(o, conflicts=o.conflicts | {s.name})
    return registry


REGISTRY: dict[str, Strategy] = _symmetric(
    [
        BASELINE,
        *precision.STRATEGIES,
        *memory.STRATEGIES,
        *optim.STRATEGIES,
        *batching.STRATEGIES,
        *freezing.STRATEGIES,
        *lm.STRATEGIES,
        *scale.STRATEGIES,
    ]
)

# The seed case studies' "All Applied" row: every speed/memory strategy that does not change what is
# trained (freezing is left out because it changes the model being fine-tuned).
ALIASES: dict[str, str] = {"all": "bf16+grad_accum+grad_ckpt+adafactor+dynamic_pad+smart_batch"}

DEFAULT_STRATEGIES = "baseline,bf16,fp16,grad_accum,grad_ckpt,adafactor,dynamic_pad,smart_batch,freeze_embeddings,all"
DEFAULT_ROWS = tuple(DEFAULT_STRATEGIES.split(","))
# each task's own default rows where the text tasks' do not fit it: a causal LM's speed strategies (packing, the losses
# without full logits, the CUDA kernels and precisions, recorded 'unsupported' where the device lacks them), and an
# image model's (no padding, no embeddings: channels_last instead). cce's kernels need 16-bit embeddings: its row
# brings bf16.
TASK_DEFAULTS = {
    "causal-lm": "baseline,bf16,fp16,tf32,grad_ckpt,adamw_fused,dynamic_pad,smart_batch,packing,padding_free,"
    "chunked_ce,liger,bf16+cce,freeze_embeddings",
    "image-classification": "baseline,bf16,fp16,tf32,channels_last,grad_accum,grad_ckpt,adafactor,adamw_fused",
}


# on a GPU the default rows add torch.compile: a candidate like any other there (its compile is a one-time cost the
# plan charges once against the planned run); on a 2-core CPU its compile takes minutes a row
CUDA_DEFAULTS = ("compile",)
# a study projected long is offered a shorter one: the baseline and one row per lever (padding, precision, memory),
# each as cheap to run as the baseline or cheaper
SHORT_ROWS = ("dynamic_pad", "bf16", "grad_ckpt")


def default_rows(task: str, device: str = "cpu") -> tuple[str, ...]:
    """The rows a study of `task` runs on `device` when --strategies is not given."""
    rows = tuple(TASK_DEFAULTS.get(task, DEFAULT_STRATEGIES).split(","))
    return rows + (CUDA_DEFAULTS if device == "cuda" else ())


ESTIMATE_STRATEGIES = "baseline,bf16,grad_ckpt,adafactor,grad_accum,bf16+grad_ckpt"  # `trainwise estimate`'s rows


def shown(rows: str) -> str:
    """A comma list of rows as help shows its default: spaced, so it wraps whole instead of being cut."""
    return ", ".join(rows.split(","))


def valid_names() -> str:
    return ", ".join([*REGISTRY, *ALIASES])


@dataclass(frozen=True)
class Row:
    """One row of a study, parsed once: what the user wrote, its strategies with their values, its plan."""

    text: str
    parts: tuple[tuple[Strategy, int | None], ...]
    plan: TrialPlan
    batch_size: int | None = None  # its own batch size (`bf16@bs32`, what `trainwise plan` tries); None: the study's

    @property
    def is_baseline(self) -> bool:
        return self.parts == ((BASELINE, None),)

    @property
    def requires(self) -> frozenset[str]:
        return frozenset().union(*(s.requires for s, _ in self.parts))

    @property
    def tasks(self) -> frozenset[str]:
        return frozenset(ALL_TASKS).intersection(*(s.tasks for s, _ in self.parts))

    def wrong_task(self, task: str) -> Strategy | None:
        """The first strategy of the row that does not apply to `task`."""
        return next((s for s, _ in self.parts if task not in s.tasks), None)

    def missing_capabilities(self, capabilities: set[str]) -> list[str]:
        """Capabilities the row needs that the device lacks (empty when it can run)."""
        return sorted(self.requires - capabilities)

    def missing_packages(self) -> list[str]:
        """Install hints for the optional packages the row needs and this environment lacks."""
        need = frozenset().union(*(s.packages for s, _ in self.parts))
        return [
            f"{pkg} (pip install 'trainwise[{PACKAGE_EXTRAS[pkg]}]')"
            for pkg in sorted(need)
            if importlib.util.find_spec(pkg) is None
        ]


def parse_row(text: str, accum_steps: int, stored: bool = False) -> Row:
    """Parse one row ("bf16+grad_ckpt", "freeze_layers=4", "all", "bf16@bs32"); raise ConfigError if it is invalid.

    `accum_steps` is the study's --accum-steps: the N of a `grad_accum` written without one. `@bsN` runs the row at
    its own batch size N instead of the study's. `stored`: a row a study already holds, read back (a rule added since,
    such as cce's need of a 16-bit precision beside it, does not make an old study unreadable)."""
    text = text.strip()
    if not text:
        raise ConfigError(f"empty strategy name; valid names: {valid_names()}")
    body, at, size = text.partition("@")
    batch = None
    if at:
        found = re.fullmatch(r"bs([1-9][0-9]*)", size)
        if found is None:
            raise ConfigError(f"{text!r}: after '@' a row takes its own batch size, e.g. {body.strip()}@bs32")
        batch = int(found.group(1))
        if body.strip() == "baseline":
            raise ConfigError(
                f"{text!r}: the baseline is measured at the study's batch size (sweep it with --batch-sizes)"
            )
    body = body.strip()
    parts: list[tuple[Strategy, int | None]] = []
    for part in ALIASES.get(body, body).split("+"):
        name, eq, raw = part.strip().partition("=")
        if name not in REGISTRY:
            raise ConfigError(f"unknown strategy {name!r} in {text!r}; valid names: {valid_names()}")
        strategy = REGISTRY[name]
        value = _value(strategy, part.strip(), raw if eq else None, text, accum_steps)
        parts.append((strategy, value))
    names = [s.name for s, _ in parts]
    if len(set(names)) != len(names):
        raise ConfigError(f"strategy {text!r} names the same strategy twice")
    if "baseline" in names and len(names) > 1:
        raise ConfigError(f"{text!r}: 'baseline' is the unmodified run and cannot be combined")
    for s, _ in parts:
        clash = s.conflicts & set(names)
        if clash:
            raise ConfigError(f"strategies {s.name!r} and {sorted(clash)[0]!r} conflict in {text!r}")
        if s.with_one_of and not s.with_one_of & set(names) and not stored:
            one = " or ".join(sorted(s.with_one_of, key=list(REGISTRY).index))
            first = sorted(s.with_one_of, key=list(REGISTRY).index)[0]
            raise ConfigError(
                f"{s.name!r} in {text!r} runs only beside {one} (its kernels take 16-bit embeddings): write "
                f"{first}+{body}"
            )
    return Row(text, tuple(parts), _plan(parts, text), batch)


def _value(strategy: Strategy, part: str, raw: str | None, text: str, accum_steps: int) -> int | None:
    if strategy.takes is None:
        if raw is not None:
            raise ConfigError(f"{part!r} in {text!r}: strategy {strategy.name!r} takes no value")
        return None
    if raw is None and strategy.default_value is not None:
        return strategy.default_value
    if raw is None:  # grad_accum: the study's --accum-steps
        if accum_steps < strategy.min_value:
            raise ConfigError(
                f"{strategy.name} needs --accum-steps >= {strategy.min_value} (or write {strategy.name}=N), "
                f"got {accum_steps}"
            )
        return accum_steps
    if not raw.isdigit() or int(raw) < strategy.min_value:
        raise ConfigError(f"{part!r} in {text!r}: the value must be a whole number >= {strategy.min_value}")
    return int(raw)


def _plan(parts: list[tuple[Strategy, int | None]], text: str) -> TrialPlan:
    values: dict[str, object] = {}
    setter: dict[str, str] = {}
    for strategy, value in parts:
        for name, v in strategy.settings(value).items():
            knob = KNOBS[name]
            if name in values and values[name] != v:
                if knob.merge is None:
                    raise ConfigError(f"{setter[name]!r} and {strategy.name!r} set {name} differently in {text!r}")
                v = knob.merge(values[name], v)
            values[name], setter[name] = v, strategy.name
    return TrialPlan(values)


def parse_rows(specs: str | Iterable[str], accum_steps: int) -> list[Row]:
    """A comma list (or list) of rows, each parsed once; order kept, duplicates dropped."""
    texts = specs.split(",") if isinstance(specs, str) else list(specs)
    rows: dict[str, Row] = {}
    for raw in texts:
        row = parse_row(raw, accum_steps)
        rows.setdefault(row.text, row)
    if not rows:
        raise ConfigError(f"no strategies given; valid names: {valid_names()}")
    return list(rows.values())


# ---- the walks: each seam's composition of every knob ---------------------------------------------------


def runtime(plan: TrialPlan, task: str, device: str) -> Runtime:
    """What the loop builds a run from (`trainwise.training.loop`)."""
    rt = Runtime(task, device)
    for knob, value in plan.items():
        knob.runtime(value, rt)
    return rt


def export_doc(plan: TrialPlan, doc: ExportDoc) -> ExportDoc:
    """The plan written into the exported files (`trainwise.exporting.scripts`)."""
    return _walk(plan, "export", doc, doc.notes)


def memory_terms(plan: TrialPlan, terms: MemoryTerms) -> MemoryTerms:
    """The plan's effect on the memory estimate (`trainwise.estimating`)."""
    for knob, value in plan.items():
        if isinstance(knob.memory, Probed):
            terms.probe[knob.name] = value
    return _walk(plan, "memory", terms, terms.notes)


def _walk(plan: TrialPlan, seam: str, target: T, notes: list[str]) -> T:
    """Every knob's `seam` on `target`; a knob set away from its default whose seam is NA adds its reason."""
    for knob, value in plan.items():
        act = getattr(knob, seam)
        if isinstance(act, NA):
            if value != knob.default:
                notes.append(f"{knob.name}: {act.reason}")
        elif not isinstance(act, Probed):
            act(value, target)
    return target


SEVERITY = {"native": 0, "inert": 1, "emulated": 2, "unsupported": 3}


def support(plan: TrialPlan, device: DeviceFacts) -> dict[str, Support]:
    """How the plan's knob values fare on `device` (knob name -> Support), for the knobs that say
    (precisions: native / emulated / inert / unsupported); from the device's facts alone."""
    found = {}
    for knob, value in plan.items():
        if knob.support is not None and (verdict := knob.support(value, device)) is not None:
            found[knob.name] = dataclasses.replace(
                verdict, subject=verdict.subject or (str(value) if knob.name == "precision" else knob.name)
            )
    return found


def worst(verdicts: dict[str, Support]) -> tuple[str, Support] | None:
    """The verdict that matters most for a row (unsupported > emulated > inert > native)."""
    return max(verdicts.items(), key=lambda kv: SEVERITY[kv[1].status], default=None)


def with_precision(row: Row, name: str | None) -> Row:
    """The row with its precision strategies replaced by `name` (None: fp32), its text kept: `all` on a
    device where bf16 is emulated trains with the best precision the device has."""
    setters = {s.name for s in REGISTRY.values() if "precision" in s.sets}
    parts = [(s, v) for s, v in row.parts if s.name not in setters]
    if name is not None:
        parts.insert(0, (REGISTRY[name], None))
    return Row(row.text, tuple(parts), _plan(parts, row.text))


def markdown() -> str:
    """docs/strategies.md: the catalogue as the registry has it (`make docs` writes it; a test checks it)."""
    lines = [
        "# Strategies",
        "",
        "Generated from the registry by `make docs` (`trainwise strategies --markdown`); do not edit by hand.",
        "",
        "| strategy | effect; cost | sets | conflicts | needs |",
        "|---|---|---|---|---|",
    ]
    for s in REGISTRY.values():
        sets = [f"{k}={v!r}" for k, v in s.sets.items()]
        if s.takes:
            default = "--accum-steps" if s.default_value is None else str(s.default_value)
            sets.append(f"{s.takes}=N (`{s.name}=N`, default {default})")
        needs = sorted(s.requires) + [f"`trainwise[{PACKAGE_EXTRAS[p]}]`" for p in sorted(s.packages)]
        if s.with_one_of:
            needs.append(" or ".join(f"`{n}`" for n in sorted(s.with_one_of, key=list(REGISTRY).index)) + " beside it")
        if s.tasks != ALL_TASKS:
            needs.append("/".join(sorted(s.tasks)))
        cells = [f"`{s.name}`", s.summary, ", ".join(sets) or "-", ", ".join(sorted(s.conflicts)) or "-"]
        lines.append("| " + " | ".join([*cells, ", ".join(needs) or "-"]) + " |")
    for alias, spec in ALIASES.items():
        lines.append(f"| `{alias}` | the seed studies' 'All Applied' row: `{spec}` | - | - | - |")
    lines += ["", "## Default rows", "", "What a study runs when --strategies is not given:", ""]
    lines.append(f"- classification, seq2seq: `{DEFAULT_STRATEGIES}`")
    lines += [f"- {task}: `{rows}`" for task, rows in TASK_DEFAULTS.items()]
    lines.append(
        "- rows the device cannot run (fp16, tf32, liger, cce on a CPU) are recorded 'unsupported', also with an "
        "explicit --device; a row you name that it cannot run is an error"
    )
    lines += [
        "",
        "## Knobs",
        "",
        "A strategy sets knobs; each knob's module says what a value does to the run, to the exported files and "
        "to the memory estimate, or why a seam does not apply (export and estimate print that reason).",
        "",
        "| knob | default | meaning | export | estimate |",
        "|---|---|---|---|---|",
    ]
    for k in KNOBS.values():
        export = f"n/a: {k.export.reason}" if isinstance(k.export, NA) else "yes"
        estimate = (
            f"n/a: {k.memory.reason}"
            if isinstance(k.memory, NA)
            else "probed"
            if isinstance(k.memory, Probed)
            else "yes"
        )
        lines.append(f"| `{k.name}` | `{k.default!r}` | {k.doc} | {export} | {estimate} |")
    return "\n".join(lines) + "\n"
