"""trainwise estimate: exact counts against hand arithmetic, and the prediction against a measured peak."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json

import pytest
import torch

from trainwise import strategies
from trainwise.estimating.peak import estimate_plan, state_parts, step_temporaries
from trainwise.estimating.probe import Calibration, calibrate
from trainwise.estimating.shapes import FEATURES, Shape, shape_of, terms_of
from trainwise.strategies.knobs import TrialPlan
from trainwise.strategies.optim import OPTIMIZERS
from trainwise.training.models import ModelSource, build_model, model_config


def plan_of(text: str, accum: int = 4) -> TrialPlan:
    return strategies.parse_row(text, accum).plan


def _cal() -> Calibration:
    """A calibration where activations are exactly tokens x hidden per layer, one byte each."""
    return Calibration("bert", "cpu", {}, {k: 0.0 for k in FEATURES} | {"tok_hidden": 1.0}, 1, 0, "", 0)


def _shape(**kw) -> Shape:
    base = dict(
        family="bert",
        seq2seq=False,
        hidden=8,
        ffn=32,
        heads=2,
        enc_layers=2,
        dec_layers=0,
        vocab=100,
        n_params=1000,
        n_trainable=1000,
        buffer_bytes=0,
        linear_elems=600,
        largest_trainable=300,
        adafactor_elems=150,
        layer_params=200,
    )
    base.update(kw)
    return Shape(**base)  # type: ignore[arg-type]


def test_meta_shape_counts_match_the_real_model():
    """The meta-device build must count exactly what the real model allocates."""
    source = ModelSource("preset", "bert-tiny")
    shape = shape_of(model_config(source, "classification", 3), "classification", TrialPlan())
    real = build_model(source, "classification", 3, seed=0)
    assert shape.n_params == sum(p.numel() for p in real.parameters())
    assert shape.n_trainable == shape.n_params
    assert (shape.hidden, shape.ffn, shape.heads, shape.enc_layers, shape.dec_layers) == (64, 128, 2, 2, 0)
    assert shape.largest_trainable == 1024 * 64  # the word embeddings
    linear = sum(m.weight.numel() for m in real.modules() if isinstance(m, torch.nn.Linear))
    assert shape.linear_elems == linear
    # Adafactor: rows + columns per matrix, every element of a vector
    ada = sum(p.shape[0] + p.shape[1] if p.dim() == 2 else p.numel() for p in real.parameters())
    assert shape.adafactor_elems == ada


def test_freezing_is_read_from_the_meta_model():
    source = ModelSource("preset", "t5-tiny")
    config = model_config(source, "seq2seq", 2)
    full = shape_of(config, "seq2seq", TrialPlan())
    frozen = shape_of(config, "seq2seq", plan_of("freeze_encoder"))
    real = build_model(source, "seq2seq", 2, seed=0)
    encoder = {id(p): p.numel() for p in real.get_encoder().parameters()}
    assert full.n_trainable - frozen.n_trainable == sum(encoder.values())
    assert full.encoder_saves and not frozen.encoder_saves  # the shared embedding is frozen with it


@pytest.mark.parametrize(
    "optimizer, expected",
    [("adamw", 8 * 1000), ("adamw_8bit", 2 * 1000), ("adafactor", 4 * 150)],
)
def test_optimizer_bytes_per_parameter(optimizer, expected):
    assert OPTIMIZERS[optimizer].state(_shape(), 4) == expected


def test_without_zero_weights_and_grads_stay_fp32_in_autocast():
    for row in ("baseline", "bf16"):
        parts, offloaded = state_parts(_shape(buffer_bytes=40), terms_of(plan_of(row), "cuda", 4))
        assert parts == {"weights": 4000 + 40, "grads": 4000, "optimizer": 8000} and offloaded == 0


def test_zero_partition_arithmetic():
    """P = 1000 params, 4 ranks, bf16: 16-bit weights and grads, fp32 master + Adam m, v = 12 B/param."""
    s = _shape()

    def z(row: str):
        return state_parts(s, terms_of(plan_of(row), "cuda", 4))

    assert z("bf16+zero1") == ({"weights": 2000, "grads": 2000, "optimizer": 12000 // 4}, 0)
    assert z("bf16+zero2") == ({"weights": 2000, "grads": 2000 // 4, "optimizer": 3000}, 0)
    # stage 3: a quarter of the weights plus one gathered layer (and its prefetch): 2 x 200 x 2 B
    assert z("bf16+zero3") == ({"weights": 500 + 800, "grads": 500, "optimizer": 3000}, 0)
    assert z("bf16+zero2_offload") == ({"weights": 2000, "grads": 500, "optimizer": 0}, 3000)
    assert z("bf16+zero3_offload") == ({"weights": 800, "grads": 500, "optimizer": 0}, 3000 + 500)
    assert z("zero2")[0] == {"weights": 4000, "grads": 1000, "optimizer": 2000}  # no master copy in fp32


def test_step_temporaries():
    s = _shape()
    assert step_temporaries(s, terms_of(TrialPlan(), "cuda")) == 4 * 1000  # for-each AdamW: a copy of every state
    assert step_temporaries(s, terms_of(TrialPlan(), "cpu")) == 2 * 4 * 300  # per-tensor loop: the largest, twice
    assert step_temporaries(s, terms_of(plan_of("zero2_offload"), "cuda")) == 0
    assert step_temporaries(s, terms_of(plan_of("adamw_fused"), "cuda")) == 0


def test_peak_is_the_larger_phase_and_accumulation_keeps_grads():
    cal = _cal()
    s = _shape(n_params=10, n_trainable=10, largest_trainable=10)
    # activations = tokens x hidden x layers = 4 x 16 x 8 x 2 = 1024 bytes >> grads (40)
    e = estimate_plan(s, cal, TrialPlan(), 4, 16, 8, "cpu", overhead=0)
    assert e.parts["activations"] == 4 * 16 * 8 * 2 and e.phase == "forward/backward"
    assert e.peak_bytes == 40 + 80 + 1024
    acc = estimate_plan(s, cal, plan_of("grad_accum=2"), 4, 16, 8, "cpu", overhead=0)
    assert acc.parts["activations"] == 512 and acc.peak_bytes == 40 + 80 + 512 + 40
    tiny_batch = estimate_plan(_shape(), cal, TrialPlan(), 1, 1, 1, "cpu", overhead=0)
    assert tiny_batch.phase == "optimizer step"
    assert tiny_batch.peak_bytes == 4000 + 8000 + 4000 + 2400


def test_the_fit_error_is_added_so_the_estimate_errs_high():
    """Issue 34: chunked_ce's fit has a 9.2% median error and its estimate of a real run came out 3.9% low."""
    s = _shape(n_params=10, n_trainable=10, largest_trainable=10)
    exact = estimate_plan(s, _cal(), TrialPlan(), 4, 16, 8, "cpu", overhead=0)
    loose = estimate_plan(s, dataclasses.replace(_cal(), residual=0.25), TrialPlan(), 4, 16, 8, "cpu", overhead=0)
    assert exact.parts["activations"] == 1024 and loose.parts["activations"] == 1280
    assert loose.peak_bytes - exact.peak_bytes == 256


def test_what_the_estimate_does_not_model_is_said_with_it():
    e = estimate_plan(_shape(), _cal(), plan_of("compile+dynamic_pad"), 4, 16, 8, "cpu", overhead=0)
    assert len(e.notes) == 1 and "eager execution" in e.notes[0]
    # dynamic padding is modelled: its batch is as wide as the data's longest row, when the data is given
    assert terms_of(plan_of("dynamic_pad"), "cpu").padding == "longest"
    assert terms_of(TrialPlan(), "cpu").padding == "max_length"


@pytest.mark.probe
def test_estimate_predicts_the_memory_compare_shows(tmp_path, cls_csv):
    """Issue 14: estimate (given compare's data) and compare's peak mem are one quantity, the peak of live
    tensors: within 10% per row, and grad_ckpt's saving within 10 points. dynamic_pad's batch is as wide
    as the data's longest row, which the estimate reads from the data (the rows are shorter than 64)."""
    from tests.conftest import tiny_study
    from trainwise.api.estimate import run_estimate
    from trainwise.estimating.data import EstimateConfig
    from trainwise.training.trial import run_trial

    rows = ["baseline", "grad_ckpt", "dynamic_pad"]
    kw = dict(batch_size=32, max_length=64, max_steps=3, warmup_steps=1, eval_samples=0)
    study = tiny_study(tmp_path, cls_csv, "classification", rows, **kw)
    measured = {spec.row: run_trial(spec) for spec in study.specs}
    cfg = EstimateConfig(strategies=tuple(rows), batch_size=32, max_length=64, train_file=str(cls_csv))
    predicted = {row: e.peak_bytes for row, e in run_estimate(None, "bert-tiny", cfg, lambda _: None).estimates}
    for row in rows:
        r = measured[row]
        assert r.status == "ok" and r.mem_kind == "cpu_allocated"
        assert r.peak_rss_bytes is not None and r.peak_rss_bytes > r.peak_mem_bytes  # the process holds more
        assert predicted[row] == pytest.approx(r.peak_mem_bytes, rel=0.10), row
    m = {row: measured[row].peak_mem_bytes for row in rows}
    assert m["dynamic_pad"] < 0.9 * m["baseline"], "the data's rows are shorter than --max-length"
    saving_measured, saving_predicted = (
        1 - m["grad_ckpt"] / m["baseline"],
        1 - predicted["grad_ckpt"] / predicted["baseline"],
    )
    assert saving_measured > 0.2 and abs(saving_measured - saving_predicted) <= 0.10
    # MFU: FLOPs counted on a real step (checkpointing recomputes the forward: more FLOPs executed)
    base, ckpt = measured["baseline"], measured["grad_ckpt"]
    assert base.flops_per_step and ckpt.flops_per_step and ckpt.flops_per_step > 1.1 * base.flops_per_step
    assert base.compute_dtype == "fp32" and base.mfu is not None and 0 < base.mfu < 1


@pytest.mark.probe
def test_unknown_family_falls_back_to_probing_its_own_config(tmp_path, capsys, monkeypatch):
    """A family with no tiny-config recipe (ELECTRA) is probed on its own config, cached, and the CLI says so."""
    from transformers import ElectraConfig, ElectraForSequenceClassification

    est = importlib.import_module("trainwise.estimating.probe")  # the calibration
    from trainwise.cli import main
    from trainwise.training.models import train_tokenizer

    # a quarter of the design (its own cache: the shorter fit stays out of the session's): the fallback, not the fit
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(est, "PROBE_DESIGN", est.PROBE_DESIGN[::4])

    config = ElectraConfig(
        vocab_size=256, embedding_size=32, hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=64, num_labels=2,
    )  # fmt: skip
    gc.freeze()  # a process that froze its own objects (a zygote's child) keeps them frozen through a calibration
    try:
        frozen = gc.get_freeze_count()
        cal = calibrate(config, "classification", TrialPlan(), "cpu")
        assert gc.get_freeze_count() > frozen // 2 > 0  # (not given back: refcounts still free a few)
    finally:
        gc.unfreeze()
    assert cal.how == "own-config probe" and cal.family == "electra"
    assert cal.coefficients["tok_hidden"] + cal.coefficients["tok_ffn"] > 0
    model_dir = tmp_path / "electra"
    train_tokenizer(["some words to learn a vocabulary from"] * 20, "bert-tiny", model_dir)
    ElectraForSequenceClassification(config).save_pretrained(model_dir)
    monkeypatch.setattr(est, "probe_point", lambda *a, **k: pytest.fail("the fit was not cached"))
    assert main(["estimate", "--model", str(model_dir), "--strategies", "baseline", "--max-length", "64"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "family 'electra' has no tiny-config recipe: fell back to probing its own config" in out


@pytest.mark.probe
def test_calibration_is_cached_and_says_which_it_was(tmp_path, monkeypatch, capsys):
    """The probe runs once per family and plan; the estimate says "calibrated now" when this command
    measured it and "cached" only when it was read from the cache (issue 27)."""
    est = importlib.import_module("trainwise.estimating.probe")  # the calibration
    from trainwise.cli import main

    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    monkeypatch.setattr(est, "PROBE_DESIGN", est.PROBE_DESIGN[:4])  # what is said and cached, not the fit
    argv = ["estimate", "--model-preset", "bert-tiny", "--strategies", "baseline", "--device", "cpu"]
    config = model_config(ModelSource("preset", "bert-tiny"), "classification", 2)
    first = calibrate(config, "classification", TrialPlan(), "cpu")
    assert not first.cached and first.provenance().startswith("calibrated now in ")
    assert gc.get_freeze_count() == 0, "the objects the probe froze for its collections are given back"
    monkeypatch.setattr(est, "probe_point", lambda *a, **k: pytest.fail("probed again"))
    again = calibrate(config, "classification", TrialPlan(), "cpu")
    assert again == first and again.cached and again.provenance() == "cached"
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 1
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "added to them as a margin; cached)." in out and "calibrated now" not in out
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(est, "probe_point", lambda *a, **k: pytest.fail("a measured figure, not the test's"))
    driver = importlib.import_module("trainwise.api.estimate")  # the verb's driver calls the calibration
    monkeypatch.setattr(driver, "calibrate", lambda *a, **k: dataclasses.replace(first, seconds=6.1))
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "as a margin; calibrated now in 6.1 s)." in out and "cached)" not in out


# ---- the CLI -------------------------------------------------------------------------------------


@pytest.mark.probe
def test_cli_table_json_and_fit(capsys):
    from trainwise.cli import main

    argv = ["estimate", "--model-preset", "bert-tiny", "--strategies", "baseline,grad_ckpt,grad_ckpt@bs32", "--json"]
    # on CPU the total includes this process's RSS, which a long pytest session inflates: a large budget
    # for "fits", and a budget below any runtime for "does not fit"
    assert main([*argv, "--device-memory", "1KB"]) == 0
    tight = json.loads(capsys.readouterr().out)
    assert not any(e["fits"] for e in tight["estimates"])
    assert all(e["total_bytes"] == e["peak_bytes"] + e["overhead_bytes"] for e in tight["estimates"])
    assert main([*argv, "--device-memory", "64GiB"]) == 0
    payload = json.loads(capsys.readouterr().out)
    rows = {e["strategy"]: e for e in payload["estimates"]}
    assert set(rows) == {"baseline", "grad_ckpt", "grad_ckpt@bs32"} and all(e["fits"] for e in rows.values())
    assert rows["grad_ckpt"]["parts"]["activations"] < rows["baseline"]["parts"]["activations"]
    sized = rows["grad_ckpt@bs32"]  # a plan's row at its own batch size (the default is 16): priced at 32
    assert sized["batch_size"] == 32 and sized["parts"]["activations"] > 1.5 * rows["grad_ckpt"]["parts"]["activations"]
    buffers = rows["baseline"]["parts"]["weights"] - 4 * payload["n_params"]  # position ids etc.
    assert 0 <= buffers < 0.05 * 4 * payload["n_params"]
    assert payload["calibration"] and payload["calibration"][0]["how"] == "tiny-config probe"


@pytest.mark.probe
def test_cli_impossible_budget_says_so_and_what_would_fit(capsys, monkeypatch, tmp_path):
    est = importlib.import_module("trainwise.estimating.probe")  # the calibration
    from trainwise.cli import main

    # what is said, not the fit: a quarter of the design, in a cache of its own (bf16's probe is emulated on an
    # AVX2-only CPU: 29 s of a fresh clone's suite for the whole design)
    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    monkeypatch.setattr(est, "PROBE_DESIGN", est.PROBE_DESIGN[::4])

    # bert-base fp32 weights are 418 MiB: with the 512 MiB CUDA context, 800 MB cannot hold them;
    # ZeRO-3 with parameter offload can
    assert (
        main(
            [
                "estimate",
                "--model-preset",
                "bert-base",
                "--device",
                "cuda",
                "--strategies",
                "baseline",
                "--device-memory",
                "800MB",
                "--nproc",
                "8",
            ]
        )
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "impossible as asked: the fp32 weights alone need 418 MiB" in out
    assert "would fit: " in out and "bf16+grad_ckpt+zero3_offload, micro-batch 1 x 16" in out


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--zero", "5"], "--zero must be 0, 1, 2 or 3"),
        (["--offload", "optimizer"], "--zero 0 --offload optimizer: choose one of --zero 1"),
        (["--zero", "2", "--offload", "params"], "--zero 2 --offload params: choose one of"),
        (["--device-memory", "lots"], "--device-memory 'lots'"),
        (["--batch-size", "0"], "--batch-size must be > 0"),
        (["--strategies", "warp_drive"], "unknown strategy 'warp_drive'"),
        (["--strategies", "grad_accum", "--batch-size", "6"], "multiple of the accumulation steps"),
        (["--model-preset", "gpt-9"], "unknown model preset"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(capsys, args, expected):
    from trainwise.cli import main

    argv = ["estimate", *args]
    if "--model-preset" not in args:
        argv += ["--model-preset", "bert-tiny"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_largest_batch_is_the_edge_of_the_estimate():
    from trainwise.estimating.peak import largest_batch

    cal = _cal()
    s = _shape(n_params=10, n_trainable=10, largest_trainable=10)
    # peak = 40 + 80 + b * 16 * 8 * 2 (activations) -> fits 120 + 256 b <= budget
    assert largest_batch(s, cal, TrialPlan(), 120 + 256 * 37, 16, 8, "cpu", overhead=0) == 37
    assert largest_batch(s, cal, plan_of("grad_accum"), 120 + 40 + 256 * 9, 16, 8, "cpu", overhead=0) == 36
    assert largest_batch(s, cal, TrialPlan(), 100, 16, 8, "cpu", overhead=0) == 0


def test_lora_counts_adapters_and_head_and_keeps_activations():
    """LoRA shapes count only the adapters and the head, and keep the encoder's activations."""
    source = ModelSource("preset", "bert-tiny")
    config = model_config(source, "classification", 3)
    lora = shape_of(config, "classification", plan_of("lora"))
    # query and value of 2 layers: r x (in + out) each = 8 x (64 + 64); the classifier 64 x 3 + 3 (peft
    # trains the head; the pooler stays frozen)
    assert lora.n_trainable == 2 * 2 * 8 * 128 + (64 * 3 + 3)
    assert lora.encoder_saves, "gradients flow through the encoder to the adapters"


def test_estimate_says_which_rows_of_the_data_it_skipped(tmp_path, cls_csv):
    """Issue 27: estimate reads the data as compare does, and says what it left out as compare does."""
    import csv

    from trainwise.estimating.data import DataFacts, EstimateConfig
    from trainwise.training.models import resolve_model

    with open(cls_csv, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    rows[4]["text"] = ""
    path = tmp_path / "one-empty.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    cfg = EstimateConfig(strategies=("baseline",), train_file=str(path))
    facts = DataFacts.read(cfg, resolve_model(None, "bert-tiny", "classification", (128, 48)))
    assert len(facts.skipped) == 1 and "skipped 1 of" in facts.skipped[0] and "line 6" in facts.skipped[0]
