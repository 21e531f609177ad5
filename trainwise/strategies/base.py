"""Strategy: a named, documented edit of a TrialPlan.

A strategy is data, not a subclass: its name, a one-line effect/cost summary, the strategies it
cannot be combined with, the device capabilities it needs, and a pure function plan -> plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainwise.plan import TrialPlan

# Capabilities a device may offer; `requires` names a subset of these.
CAPABILITIES = ("cuda", "bf16", "fp16")
# Tasks: text ones (tokenized sequences: padding, attention, layers to freeze) and images.
TEXT_TASKS = frozenset({"classification", "seq2seq"})
IMAGE_TASKS = frozenset({"image-classification"})
# Optional packages a strategy may need (import name -> the trainwise extra that installs it).
PACKAGE_EXTRAS = {"bitsandbytes": "bnb", "peft": "lora", "deepspeed": "deepspeed"}


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str  # "effect; cost" in one line, shown by --help and `trainwise compare --list`
    apply: Callable[[TrialPlan, int], TrialPlan]  # (plan, accum_steps) -> plan
    conflicts: frozenset[str] = frozenset()
    requires: frozenset[str] = frozenset()
    packages: frozenset[str] = frozenset()  # import names, each a key of PACKAGE_EXTRAS
    tasks: frozenset[str] = TEXT_TASKS | IMAGE_TASKS  # the tasks it applies to
    # strategies that take a value ("freeze_layers=4"): (plan, value) -> plan, after `apply`
    with_value: Callable[[TrialPlan, int], TrialPlan] | None = None

    def __post_init__(self) -> None:
        unknown = self.requires - set(CAPABILITIES)
        assert not unknown, f"{self.name}: unknown capabilities {unknown}"
        assert self.packages <= set(PACKAGE_EXTRAS), f"{self.name}: packages without an extra"
