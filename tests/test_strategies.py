"""The registry's contract and the spec parser."""

from __future__ import annotations

import pytest

from trainwise import strategies
from trainwise.errors import ConfigError
from trainwise.plan import TrialPlan
from trainwise.strategies.base import CAPABILITIES


@pytest.mark.parametrize("name", list(strategies.REGISTRY))
def test_every_strategy_is_documented_and_consistent(name):
    s = strategies.REGISTRY[name]
    assert s.name == name
    assert ";" in s.summary or name == "baseline", "summary says effect; cost"
    assert s.requires <= set(CAPABILITIES)
    for other in s.conflicts:
        assert other in strategies.REGISTRY
        assert name in strategies.REGISTRY[other].conflicts, "conflicts are symmetric"


def test_plans_reflect_each_strategy():
    plan = strategies.build_plan
    assert plan("baseline", 4) == TrialPlan()
    assert plan("bf16", 4).precision == "bf16"
    assert plan("fp16", 4).precision == "fp16"
    assert plan("grad_accum", 4).accum_steps == 4
    assert plan("grad_ckpt", 4).grad_ckpt
    assert plan("adafactor", 4).optimizer == "adafactor"
    assert plan("dynamic_pad", 4).padding == "longest"
    smart = plan("smart_batch", 4)
    assert (smart.padding, smart.sampler) == ("longest", "length_grouped")
    assert plan("freeze_embeddings+freeze_encoder", 4).freeze == ("embeddings", "encoder")
    assert (plan("sortish", 4).sampler, plan("sortish", 4).padding) == ("sortish", "longest")
    assert plan("tf32", 4).tf32
    for name in ("adamw_foreach", "adamw_fused", "adamw_8bit"):
        assert plan(name, 4).optimizer == name
    combined = plan("all", 2)
    assert (combined.precision, combined.accum_steps, combined.grad_ckpt, combined.optimizer) == (
        "bf16",
        2,
        True,
        "adafactor",
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bogus", "unknown strategy 'bogus'"),
        ("bf16+nope", "unknown strategy 'nope'"),
        ("bf16+fp16", "conflict"),
        ("baseline+bf16", "cannot be combined"),
        ("bf16+bf16", "twice"),
        ("", "empty strategy"),
    ],
)
def test_bad_specs_are_rejected_with_the_valid_names(spec, message):
    with pytest.raises(ConfigError, match=message) as err:
        strategies.parse_spec(spec)
    if "unknown" in message or "empty" in message:
        assert "grad_ckpt" in str(err.value) and "all" in str(err.value)


def test_parse_list_keeps_order_and_drops_duplicates():
    assert strategies.parse_list("bf16, baseline,bf16,all") == ["bf16", "baseline", "all"]


def test_a_missing_package_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    assert strategies.missing_packages("adamw_8bit") == ["bitsandbytes (pip install 'trainwise[bnb]')"]
    assert strategies.missing_packages("bf16+adamw_fused") == []


def test_missing_capabilities():
    assert strategies.missing_capabilities("fp16", {"bf16"}) == ["cuda", "fp16"]
    assert strategies.missing_capabilities("bf16+grad_ckpt", {"bf16"}) == []
    assert strategies.missing_capabilities("all", set()) == ["bf16"]


def test_a_study_with_a_missing_package_stops_before_writing(tmp_path, cls_csv, monkeypatch):
    """On a CUDA device without bitsandbytes, adamw_8bit is an error naming the extra, before any file."""
    import importlib.util

    import trainwise.study as study

    from .conftest import tiny_study

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    monkeypatch.setattr(study, "resolve_device", lambda _d: ("cuda", {"cuda", "fp16", "bf16"}))
    out = tmp_path / "s"
    with pytest.raises(ConfigError, match=r"'adamw_8bit' needs bitsandbytes \(pip install 'trainwise\[bnb\]'\)"):
        tiny_study(out, cls_csv, "classification", ["baseline", "adamw_8bit"])
    assert not out.exists()
