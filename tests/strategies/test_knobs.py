"""The coverage contract: every knob of the plan is handled by the runtime, by export and by the memory
estimate, or declares why a seam does not apply (and export / estimate print that reason).

Walked over the registry: a knob (or a strategy) added without its seams fails here, not in a user's run.
"""

from __future__ import annotations

import dataclasses

import pytest

from trainwise import strategies
from trainwise.exporting.arguments import RunSettings, export_doc
from trainwise.strategies.base import NA, PROBED, MemoryTerms
from trainwise.strategies.knobs import TrialPlan

SETTINGS = RunSettings("bert-base-uncased", "classification", 32, 128, 48, 5e-5, 100, nproc=2)
# every value a strategy gives a knob, with the strategy that gives it
VALUES = sorted(
    {
        (name, repr(value), s.name)
        for s in strategies.REGISTRY.values()
        for name, value in s.settings(2 if s.takes else None).items()
    }
)


def _single(name: str, strategy: str) -> TrialPlan:
    """The plan with only this knob at the strategy's value (others at the baseline)."""
    value = strategies.REGISTRY[strategy].settings(2 if strategies.REGISTRY[strategy].takes else None)[name]
    extra = {"zero_stage": 2} if name == "offload" else {}  # offload comes with a ZeRO stage
    return TrialPlan({name: value, **extra})


@pytest.mark.parametrize("name", list(strategies.KNOBS))
def test_every_knob_has_all_three_seams_or_a_reason(name):
    knob = strategies.KNOBS[name]
    assert callable(knob.runtime)
    for seam in (knob.export, knob.memory):
        assert callable(seam) or seam is PROBED or (isinstance(seam, NA) and len(seam.reason) > 20), (name, seam)
    assert knob.doc and knob.default is not None
    if knob.choices is not None:
        assert knob.default in knob.choices


def _runtime_fields(plan: TrialPlan) -> dict:
    rt = strategies.runtime(plan, "classification", "cuda")  # composing calls no CUDA; tf32 is a CUDA switch
    return {
        f.name: len(v) if isinstance(v, list) else sorted(v) if isinstance(v, dict) else v
        for f in dataclasses.fields(rt)
        if not callable(v := getattr(rt, f.name)) or f.name == "optimizer"
    }


@pytest.mark.parametrize("name, value, strategy", VALUES)
def test_the_runtime_acts_on_every_value(name, value, strategy):
    base, plan = TrialPlan(), _single(name, strategy)
    assert _runtime_fields(plan) != _runtime_fields(base), f"{name}={value}: the runtime ignores it"


@pytest.mark.parametrize("name, value, strategy", VALUES)
def test_export_writes_every_value_or_says_why_not(name, value, strategy):
    base, doc = export_doc(TrialPlan(), SETTINGS), export_doc(_single(name, strategy), SETTINGS)
    knob = strategies.KNOBS[name]
    if isinstance(knob.export, NA):
        assert any(knob.export.reason in n for n in doc.notes), "the NA reason is printed"
        return
    changed = {f.name for f in dataclasses.fields(doc) if getattr(doc, f.name) != getattr(base, f.name)}
    assert changed, f"{name}={value}: export neither writes it nor says why not"
    if doc.args == base.args and name != "offload":  # ZeRO offload lives in ds_config only
        assert doc.notes != base.notes, f"{name}={value}: not a TrainingArguments field, and export does not say so"


@pytest.mark.parametrize("name, value, strategy", VALUES)
def test_the_estimate_models_every_value_or_says_why_not(name, value, strategy):
    def terms(plan: TrialPlan) -> MemoryTerms:
        return strategies.memory_terms(plan, MemoryTerms("cuda", 4))

    base, t = terms(TrialPlan()), terms(_single(name, strategy))
    knob = strategies.KNOBS[name]
    if isinstance(knob.memory, NA):
        assert t.notes == [f"{name}: {knob.memory.reason}"]
        return
    if any(n.startswith(f"{strategy}: not modelled: ") for n in t.notes):  # a value the seam says it cannot model
        return
    assert dataclasses.replace(t, notes=[]) != dataclasses.replace(base, notes=[]), f"{name}={value}: not modelled"


def test_export_prints_reasons_and_the_snippet_does_the_rest(tmp_path):
    """Export prints the reasons, and the snippet applies what the arguments cannot."""
    from trainwise.exporting.scripts import write_export

    row = strategies.parse_row("sortish+freeze_embeddings+eager_attn", 4)
    paths, notes = write_export(row.plan, SETTINGS, tmp_path)
    text = " ".join(notes)
    for knob in ("sortish", "freeze", "attention"):
        assert f"{knob}" in text
    snippet = (tmp_path / "train_snippet.py").read_text()
    compile(snippet, "train_snippet.py", "exec")
    assert "attn_implementation='eager'" in snippet
    assert all(f"# {n}" in snippet for n in notes), "the snippet carries the notes"
