"""The registry and the row parser: every entry documented, rows parsed once into plans, bad rows refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.strategies.knobs import TrialPlan

DOCS = Path(__file__).resolve().parents[2] / "docs" / "strategies.md"


def plan(text: str, accum: int = 4) -> dict:
    return strategies.parse_row(text, accum).plan.changed()


@pytest.mark.parametrize("name", list(strategies.REGISTRY))
def test_every_strategy_has_effect_cost_and_known_knobs(name):
    s = strategies.REGISTRY[name]
    assert ";" in s.summary or name == "baseline", "summary says effect; cost"
    assert set(s.sets) <= set(strategies.KNOBS)
    assert s.takes is None or s.takes in strategies.KNOBS
    assert name == "baseline" or s.sets or s.takes, "a strategy that sets nothing does nothing"


def test_no_effect_text_claims_an_unmeasured_speed():
    """Issue 27: `strategies` once said bf16 was ~25% faster "on this CPU", where it measured 19x slower. A
    speed-up in a summary names the hardware it holds on; a verdict about this device says its facts (flags,
    compute capability), and its speed only as the measured ratio that `Support.line` adds."""
    from trainwise.core.device import DeviceFacts

    hardware = ("GPU", "CUDA", "Ampere", "AMX", "tensor-core", "where ")
    for s in strategies.REGISTRY.values():
        here = [w for w in ("this CPU", "this GPU", "this device", "this machine", " here") if w in s.summary]
        assert not here, (s.name, here)
        if "faster" in s.summary:
            assert any(h in s.summary for h in hardware), f"{s.name}: faster where? {s.summary}"
    devices = [
        DeviceFacts("cpu", "AMD EPYC", frozenset({"avx2"})),
        DeviceFacts("cpu", "Intel Xeon", frozenset({"avx512_bf16", "amx_bf16"})),
        *(DeviceFacts("cuda", f"GPU {cap}", frozenset(), cap) for cap in ((6, 1), (7, 0), (8, 0))),
    ]
    for knob in strategies.KNOBS.values():
        for value in (knob.choices or (True,)) if knob.support else ():
            for device in devices:
                verdict = knob.support(value, device)
                if verdict is not None:
                    said = verdict.reason.lower()
                    assert not any(w in said for w in ("faster", "slower", "%")), (knob.name, value, verdict.reason)


def test_every_knob_is_set_by_some_strategy():
    set_by = {k for s in strategies.REGISTRY.values() for k in [*s.sets, *([s.takes] if s.takes else [])]}
    assert set_by == set(strategies.KNOBS), "a knob no strategy sets is dead code"


def test_rows_parse_into_plans():
    assert plan("baseline") == {}
    assert plan("bf16") == {"precision": "bf16"}
    assert plan("grad_accum") == {"accum_steps": 4} and plan("grad_accum=2") == {"accum_steps": 2}
    assert plan("smart_batch") == {"padding": "longest", "sampler": "length_grouped"}
    assert plan("freeze_embeddings+freeze_encoder") == {"freeze": ("embeddings", "encoder")}
    assert plan("freeze_layers") == {"freeze_layers": -1} and plan("freeze_layers=3") == {"freeze_layers": 3}
    assert plan("empty_cache") == {"empty_cache_steps": 4} and plan("empty_cache=8") == {"empty_cache_steps": 8}
    assert plan("zero2_offload") == {"zero_stage": 2, "offload": "optimizer"}
    assert plan("all", 2) == {
        "precision": "bf16",
        "accum_steps": 2,
        "grad_ckpt": True,
        "optimizer": "adafactor",
        "padding": "longest",
        "sampler": "length_grouped",
    }
    row = strategies.parse_row("all", 2)
    assert row.text == "all" and [s.name for s, _ in row.parts][:2] == ["bf16", "grad_accum"]
    assert strategies.parse_row("baseline", 4).is_baseline and not row.is_baseline


def test_a_plan_round_trips_json_keeping_only_what_differs():
    p = strategies.parse_row("bf16+freeze_embeddings+grad_accum=2", 4).plan
    assert TrialPlan.from_dict(p.to_dict()) == p
    assert p.to_dict()["freeze"] == ["embeddings"] and p.to_dict()["grad_ckpt"] is False
    assert TrialPlan(precision="fp32", grad_ckpt=False) == TrialPlan()
    with pytest.raises(ValueError, match="unknown plan field"):
        TrialPlan(warp_drive=True)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bogus", "unknown strategy 'bogus'"),
        ("bf16+nope", "unknown strategy 'nope'"),
        ("bf16+fp16", "conflict"),
        ("baseline+bf16", "cannot be combined"),
        ("bf16+bf16", "twice"),
        ("", "empty strategy"),
        ("bf16=2", "takes no value"),
        ("freeze_layers=x", "whole number >= 1"),
        ("grad_accum=1", "whole number >= 2"),
        ("bf16@32", "own batch size, e.g. bf16@bs32"),
        ("bf16@bs0", "own batch size"),
        ("baseline@bs16", "the study's batch size"),
        ("bf16@bs\u00b2", "own batch size"),
    ],
)
def test_bad_rows_are_rejected_with_the_valid_names(spec, message):
    with pytest.raises(ConfigError, match=message) as err:
        strategies.parse_row(spec, 4)
    if "unknown" in message or "empty" in message:
        assert "grad_ckpt" in str(err.value) and "all" in str(err.value)


def test_grad_accum_needs_two_or_more_micro_batches():
    with pytest.raises(ConfigError, match="grad_accum needs --accum-steps >= 2"):
        strategies.parse_row("grad_accum", 1)
    assert plan("bf16", 1) == {"precision": "bf16"}, "--accum-steps 1 is fine for rows without grad_accum"


def test_a_row_at_its_own_batch_size_is_one_cell_at_that_size(tmp_path):
    """`trainwise plan` tries the leader at a larger batch as a row of the same study: `bf16+smart_batch@bs32`
    has the plan of `bf16+smart_batch`, runs once at 32 whatever the study's size or sweep, and is named as
    written (no sweep label added)."""
    from trainwise.spec.config import StudyConfig

    row = strategies.parse_row("bf16+smart_batch@bs32", 4)
    assert row.batch_size == 32 and row.plan == strategies.parse_row("bf16+smart_batch", 4).plan
    cfg = StudyConfig(out=str(tmp_path), strategies=["baseline", "bf16@bs32"], batch_size=8, batch_sizes=(8, 16))
    assert [(c.label(), c.batch_size) for c in cfg.cells()] == [
        ("baseline @bs8", 8),
        ("baseline @bs16", 16),
        ("bf16@bs32", 32),
    ]
    with pytest.raises(ConfigError, match="multiple of the accumulation steps"):
        StudyConfig(out=str(tmp_path), strategies=["baseline", "grad_accum=3@bs32"], batch_size=6)
    from trainwise.training.fit import check_one_process

    with pytest.raises(ConfigError, match="leave out @bs32"):  # tune samples its batch size itself
        check_one_process(StudyConfig(out=str(tmp_path), strategies=["bf16@bs32"]), "tune")


def test_parse_rows_keeps_order_and_drops_duplicates():
    rows = strategies.parse_rows("bf16, baseline,bf16,all", 4)
    assert [r.text for r in rows] == ["bf16", "baseline", "all"]


def test_a_missing_package_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    assert strategies.parse_row("adamw_8bit", 4).missing_packages() == ["bitsandbytes (pip install 'trainwise[bnb]')"]
    assert strategies.parse_row("bf16+adamw_fused", 4).missing_packages() == []


def test_missing_capabilities():
    assert strategies.parse_row("fp16", 4).missing_capabilities({"bf16"}) == ["cuda", "fp16"]
    assert strategies.parse_row("bf16+grad_ckpt", 4).missing_capabilities({"bf16"}) == []
    assert strategies.parse_row("all", 4).missing_capabilities(set()) == ["bf16"]


def test_a_study_with_a_missing_package_stops_before_writing(tmp_path, cls_csv, monkeypatch):
    """On a CUDA device without bitsandbytes, adamw_8bit is an error naming the extra, before any file."""
    import importlib.util

    import trainwise.study.prepare as study
    from tests.conftest import tiny_study

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name))
    monkeypatch.setattr(study, "resolve_device", lambda _d: ("cuda", {"cuda", "fp16", "bf16"}))
    out = tmp_path / "s"
    with pytest.raises(ConfigError, match=r"'adamw_8bit' needs bitsandbytes \(pip install 'trainwise\[bnb\]'\)"):
        tiny_study(out, cls_csv, "classification", ["baseline", "adamw_8bit"])
    assert not out.exists()


def test_docs_strategies_md_is_the_registry():
    """docs/strategies.md is generated (`make docs`); a strategy added without regenerating it fails here."""
    assert DOCS.read_text(encoding="utf-8") == strategies.markdown(), "run `make docs`"
    for name in strategies.REGISTRY:
        assert f"`{name}`" in strategies.markdown()
