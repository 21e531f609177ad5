"""The strategy catalogue: one registry, and the parser for specs like "bf16+grad_ckpt+adafactor"."""

from __future__ import annotations

import dataclasses

from trainwise.errors import ConfigError
from trainwise.plan import TrialPlan
from trainwise.strategies import batching, freezing, memory, optim, precision, scale
from trainwise.strategies.base import Strategy

BASELINE = Strategy("baseline", "vanilla fp32, AdamW, pad to max length; the 100% row", lambda p, _n: p)


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
        *scale.STRATEGIES,
    ]
)

# The seed case studies' "All Applied" row: every speed/memory strategy that does not change what is
# trained (freezing is left out because it changes the model being fine-tuned).
ALIASES: dict[str, str] = {"all": "bf16+grad_accum+grad_ckpt+adafactor+dynamic_pad+smart_batch"}

DEFAULT_STRATEGIES = "baseline,bf16,fp16,grad_accum,grad_ckpt,adafactor,dynamic_pad,smart_batch,freeze_embeddings,all"


def valid_names() -> str:
    return ", ".join([*REGISTRY, *ALIASES])


def parse_spec(spec: str) -> tuple[Strategy, ...]:
    """Parse one row's spec ("bf16+grad_ckpt", "all") into strategies; raise ConfigError if invalid."""
    spec = spec.strip()
    if not spec:
        raise ConfigError(f"empty strategy name; valid names: {valid_names()}")
    parts = [p.strip().split("=")[0] for p in ALIASES.get(spec, spec).split("+")]
    _values(spec)  # validates "name=N" parts
    unknown = [p for p in parts if p not in REGISTRY]
    if unknown:
        raise ConfigError(f"unknown strategy {unknown[0]!r} in {spec!r}; valid names: {valid_names()}")
    if len(set(parts)) != len(parts):
        raise ConfigError(f"strategy {spec!r} names the same strategy twice")
    if "baseline" in parts and len(parts) > 1:
        raise ConfigError(f"{spec!r}: 'baseline' is the unmodified run and cannot be combined")
    chosen = tuple(REGISTRY[p] for p in parts)
    for s in chosen:
        clash = s.conflicts & set(parts)
        if clash:
            raise ConfigError(f"strategies {s.name!r} and {sorted(clash)[0]!r} conflict in {spec!r}")
    return chosen


def parse_list(specs: str) -> list[str]:
    """Split a comma list of row specs, validate each, keep order, drop duplicates."""
    rows: list[str] = []
    for raw in specs.split(","):
        spec = raw.strip()
        parse_spec(spec)
        if spec not in rows:
            rows.append(spec)
    if not rows:
        raise ConfigError(f"no strategies given; valid names: {valid_names()}")
    return rows


def missing_capabilities(spec: str, capabilities: set[str]) -> list[str]:
    """Capabilities the spec needs that the device lacks (empty when it can run)."""
    need: set[str] = set()
    for s in parse_spec(spec):
        need |= s.requires
    return sorted(need - capabilities)


def missing_packages(spec: str) -> list[str]:
    """Install hints for the optional packages the spec needs and this environment lacks."""
    import importlib.util

    from trainwise.strategies.base import PACKAGE_EXTRAS

    need: set[str] = set()
    for s in parse_spec(spec):
        need |= s.packages
    return [
        f"{pkg} (pip install 'trainwise[{PACKAGE_EXTRAS[pkg]}]')"
        for pkg in sorted(need)
        if importlib.util.find_spec(pkg) is None
    ]


def _values(spec: str) -> dict[str, int]:
    """The values of "name=N" parts (freeze_layers=4); only strategies with `with_value` take one."""
    values: dict[str, int] = {}
    for part in ALIASES.get(spec.strip(), spec.strip()).split("+"):
        name, eq, raw = part.strip().partition("=")
        if not eq:
            continue
        strategy = REGISTRY.get(name)
        if strategy is None or strategy.with_value is None:
            raise ConfigError(f"{part.strip()!r} in {spec!r}: strategy {name!r} takes no value")
        if not raw.isdigit() or int(raw) <= 0:
            raise ConfigError(f"{part.strip()!r} in {spec!r}: the value must be a whole number > 0")
        values[name] = int(raw)
    return values


def build_plan(spec: str, accum_steps: int) -> TrialPlan:
    plan = TrialPlan()
    values = _values(spec)
    for s in parse_spec(spec):
        plan = s.apply(plan, accum_steps)
        if s.name in values:
            assert s.with_value is not None
            plan = s.with_value(plan, values[s.name])
    return plan
