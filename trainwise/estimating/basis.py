"""A study's plans priced by the memory estimate: what it prices them on (the study's trials' settings, the model's
config, the runtime's overhead) and a plan's estimate at a global batch size."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainwise.core.errors import ConfigError
from trainwise.estimating.peak import MemoryEstimate, estimate_plan, runtime_overhead, target_length
from trainwise.estimating.probe import calibrate
from trainwise.estimating.shapes import shape_of
from trainwise.strategies.knobs import TrialPlan
from trainwise.study.store import Store
from trainwise.training.models import ModelSource, model_config


def estimate_basis(study: Path):
    """What `trainwise estimate` prices a study's plans on: its trials' settings (model, batch, lengths, device),
    the model's config and the runtime's overhead; None when the study has no trial or its model cannot be
    built here (a hub id offline)."""
    spec = Store.spec_of(study, "STUDY", "baseline")  # the baseline's: its batch is the study's
    if spec is None:
        return None
    s = spec.settings
    try:
        config = model_config(ModelSource(s.model_kind, s.model_ref), s.task, s.num_labels or 2)
    except ConfigError:
        return None
    return s, config, runtime_overhead(s.device)


def price(found, plan: TrialPlan, batch: int, on_probe: Callable[[int, int], None] | None = None) -> MemoryEstimate:
    """`trainwise estimate` of a plan of a study (`estimate_basis`'s settings, config and overhead) at a global batch
    size: each of the study's --nproc ranks takes its share, at the study's lengths (ConfigError: a plan the
    estimate does not model). Calibrates once per knob set (cached)."""
    s, config, overhead = found
    cal, shape = calibrate(config, s.task, plan, s.device, on_probe), shape_of(config, s.task, plan)
    target = target_length(s.task, s.max_length, s.max_target_length)
    per_rank = max(1, batch // s.nproc)
    return estimate_plan(shape, cal, plan, per_rank, s.max_length, target, s.device, s.nproc, overhead)
