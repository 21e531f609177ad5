"""TrialPlan: the resolved knob values one row runs with.

The knobs themselves (their defaults and what each value does) are declared next to the strategies
that set them, in `trainwise/strategies/`; a plan only holds the values that differ from the
defaults, which are the vanilla baseline of the seed case studies (fp32, no accumulation, no
checkpointing, AdamW, padding to max length, random batches, nothing frozen).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from trainwise.strategies import batching, freezing, lm, memory, optim, precision, scale
from trainwise.strategies.base import Knob

V = TypeVar("V")

# Every knob by name, in the order the runtime applies them (model edits: layout, checkpointing,
# freezing, LoRA; the optimizer before ZeRO-Offload replaces it; precision before ZeRO reads it).
# The families declare them; a plan holds their values.
KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [*precision.KNOBS, *memory.KNOBS, *batching.KNOBS, *freezing.KNOBS, *lm.KNOBS, *optim.KNOBS, *scale.KNOBS]
}


def _knobs() -> Mapping[str, Knob]:
    return KNOBS


class TrialPlan:
    """Immutable knob values. `plan[KNOB]` reads one (typed by the knob); unset knobs are at their default."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, object] | None = None, **more: object):
        knobs = _knobs()
        kept: dict[str, object] = {}
        for name, value in {**(values or {}), **more}.items():
            if name not in knobs:
                raise ValueError(f"unknown plan field {name!r}")
            knob = knobs[name]
            if isinstance(knob.default, tuple) and isinstance(value, list):
                value = tuple(value)  # from JSON
            knob.check(value)
            if value != knob.default:
                kept[name] = value
        self._values = dict(sorted(kept.items()))

    def __getitem__(self, knob: Knob[V]) -> V:
        return self._values.get(knob.name, knob.default)  # type: ignore[return-value]

    def value(self, name: str) -> Any:
        """A knob's value by name (for code that walks every knob)."""
        return self._values.get(name, _knobs()[name].default)

    def items(self) -> Iterator[tuple[Knob, Any]]:
        """Every knob with its value, defaults included, in registry order."""
        for name, knob in _knobs().items():
            yield knob, self._values.get(name, knob.default)

    def changed(self) -> dict[str, Any]:
        """The values that differ from the baseline's."""
        return dict(self._values)

    def with_(self, **changes: object) -> TrialPlan:
        return TrialPlan({**self._values, **changes})

    def to_dict(self) -> dict[str, Any]:
        """Every knob (defaults included), JSON-ready."""
        return {k.name: list(v) if isinstance(v, tuple) else v for k, v in self.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> TrialPlan:
        return cls(d)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrialPlan) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"TrialPlan({inner})"
