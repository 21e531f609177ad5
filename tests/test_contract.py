"""Contract: every registered strategy trains two steps on a tiny model and its effect is visible."""

from __future__ import annotations

import math

import pytest
import torch

from trainwise import strategies
from trainwise.models import ModelSource, build_model
from trainwise.plan import TrialPlan
from trainwise.trial import apply_model_plan, frozen_parameters, make_optimizer, run_trial

ROWS = list(strategies.REGISTRY) + list(strategies.ALIASES)


def _spec(study, row):
    return next(s for s in study.specs if s.strategy == row)


@pytest.mark.parametrize("row", ROWS)
def test_every_strategy_trains_two_steps(cls_study, row):
    needs = strategies.REGISTRY[row].requires if row in strategies.REGISTRY else frozenset()
    if "cuda" in needs and not torch.cuda.is_available():
        pytest.skip(f"{row} needs CUDA (on CPU a study records it as 'unsupported')")
    if row in strategies.scale.ZERO:
        pytest.skip(f"{row} runs under torchrun: test_zero_rows_train_under_torchrun")
    if row in strategies.REGISTRY and "classification" not in strategies.REGISTRY[row].tasks:
        pytest.skip(f"{row} is for images: test_vision.py")
    spec = _spec(cls_study, row)
    r = run_trial(spec)
    assert r.status == "ok"
    assert r.plan == strategies.build_plan(row, 4).to_dict()
    assert r.timed_steps == 1 and r.step_time_s > 0 and r.samples_per_s > 0
    assert math.isfinite(r.train_loss) and 0 < r.train_loss < 10
    # in-process, freed allocator memory is reused, so growth can be 0; test_study checks a fresh process
    assert r.peak_mem_bytes >= 0 and r.mem_kind == "cpu_rss_delta"
    assert 0 <= r.padding_waste < 1
    assert r.metric_name == "accuracy" and 0 <= r.metric <= 100
    assert r.env["torch"] == torch.__version__ and r.env["device"] == "cpu"
    trainable_share = r.n_trainable / r.n_params
    if row == "lora":
        assert trainable_share < 0.2, "only the adapters and the head train"
    else:
        assert trainable_share < 1 if "freeze" in row else trainable_share == 1


@pytest.mark.slow
def test_zero_rows_train_under_torchrun(tmp_path, cls_csv):
    """Every ZeRO strategy trains as 2 gloo ranks under DeepSpeed (zero2 is in test_distributed)."""
    from trainwise.launcher import launch

    from .conftest import tiny_study

    rows = [r for r in strategies.scale.ZERO if r != "zero2"]
    study = tiny_study(tmp_path, cls_csv, "classification", rows, nproc=2, max_steps=2, eval_samples=8)
    for spec in study.specs:
        r = launch(spec, study.out / "trials" / spec.key(), 600, lambda e: None)
        assert r.status == "ok", (spec.strategy, r.message)
        assert r.world_size == 2 and r.plan == strategies.build_plan(spec.strategy, 4).to_dict()
        assert math.isfinite(r.train_loss) and r.metric_name == "accuracy"
        # the state each rank holds shrinks with the stage: 16 B/param without ZeRO
        assert r.state_bytes < 16 * r.n_params


@pytest.mark.parametrize("row", ["baseline", "all"])
def test_seq2seq_trains_and_reports_rouge_and_bleu(s2s_study, row):
    r = run_trial(_spec(s2s_study, row))
    assert r.status == "ok" and r.metric_name == "rougeL"
    assert set(r.metrics) == {"rouge1", "rouge2", "rougeL", "bleu"}
    assert math.isfinite(r.train_loss)


def _tiny_model(task="classification"):
    preset = "bert-tiny" if task == "classification" else "t5-tiny"
    return build_model(ModelSource("preset", preset), task, 2, seed=0)


def test_grad_ckpt_turns_on_checkpointing():
    model = _tiny_model()
    apply_model_plan(model, TrialPlan(grad_ckpt=True))
    assert model.is_activation_checkpointing


@pytest.mark.parametrize("task", ["classification", "seq2seq"])
def test_freezing_freezes_exactly_the_named_part(task):
    model = _tiny_model(task)
    apply_model_plan(model, TrialPlan(freeze=("embeddings",)))
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all("embed" in n or "shared" in n for n in frozen)
    model = _tiny_model(task)
    apply_model_plan(model, TrialPlan(freeze=("encoder",)))
    encoder_ids = {id(p) for p in frozen_parameters(model, "encoder")}
    assert all(not p.requires_grad for p in model.parameters() if id(p) in encoder_ids)
    assert any(p.requires_grad for p in model.parameters()), "the head still trains"


def test_lora_adapts_only_the_attention_projections_and_the_head():
    from trainwise.trial import apply_lora

    for task in ("classification", "seq2seq"):
        model = apply_lora(_tiny_model(task), TrialPlan(lora_r=4), task)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert any("lora_A" in n for n in trainable) and any("lora_B" in n for n in trainable)
        assert all("lora_" in n or "classifier" in n for n in trainable), trainable


def test_lora_on_a_model_peft_cannot_target_is_one_line_before_training(tmp_path, cls_csv):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    from trainwise.errors import ConfigError
    from trainwise.models import train_tokenizer

    from .conftest import tiny_study

    model_dir = tmp_path / "distil"
    train_tokenizer(["a few words"] * 10, "bert-tiny", model_dir)
    DistilBertForSequenceClassification(
        DistilBertConfig(vocab_size=256, dim=32, n_layers=1, n_heads=2)
    ).save_pretrained(model_dir)
    out = tmp_path / "s"
    with pytest.raises(ConfigError, match="peft knows no attention modules to adapt in a 'distilbert' model"):
        tiny_study(out, cls_csv, "classification", ["baseline", "lora"], model_preset=None, model=str(model_dir))
    assert not out.exists()


def test_optimizer_variants_take_the_same_step():
    """foreach and fused AdamW are implementations, not different math: one step, same weights."""
    after = {}
    for name in ("adamw", "adamw_foreach", "adamw_fused"):
        model = _tiny_model()
        opt = make_optimizer(name, list(model.parameters()), 1e-3)
        model(input_ids=torch.ones(2, 4, dtype=torch.long)).logits.sum().backward()
        opt.step()
        after[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
        group = opt.param_groups[0]
        assert group["foreach"] is (True if name == "adamw_foreach" else None)
        assert group["fused"] is (True if name == "adamw_fused" else None)
    torch.testing.assert_close(after["adamw_foreach"], after["adamw"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after["adamw_fused"], after["adamw"], rtol=1e-5, atol=1e-6)


def test_adafactor_keeps_less_optimizer_state_than_adamw():
    def state_numel(name):
        model = _tiny_model()
        opt = make_optimizer(name, list(model.parameters()), 1e-3)
        out = model(input_ids=torch.ones(2, 4, dtype=torch.long)).logits.sum()
        out.backward()
        opt.step()
        return sum(t.numel() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))

    assert state_numel("adafactor") < 0.6 * state_numel("adamw")


def test_state_bytes_count_weights_grads_and_optimizer_state(tmp_path, cls_csv):
    """AdamW keeps exp_avg + exp_avg_sq (8 bytes/param) that Adafactor factors away; freezing drops the
    frozen parameters' grads and state. The counted state must show exactly that."""
    from .conftest import tiny_study

    study = tiny_study(
        tmp_path,
        cls_csv,
        "classification",
        ["baseline", "adafactor", "freeze_encoder"],
        eval_samples=0,
        max_steps=2,
        warmup_steps=1,
    )
    adamw, adafactor, frozen = (run_trial(spec) for spec in study.specs)
    weights = 4 * adamw.n_params
    assert adamw.state_bytes == pytest.approx(weights + 4 * adamw.n_params + 8 * adamw.n_params, rel=0.01)
    assert adamw.state_bytes - adafactor.state_bytes == pytest.approx(8 * adamw.n_params, rel=0.1)
    frozen_params = adamw.n_params - frozen.n_trainable
    assert adamw.state_bytes - frozen.state_bytes == pytest.approx(12 * frozen_params, rel=0.01)


@pytest.mark.parametrize("task, stack", [("classification", "bert.encoder.layer"), ("seq2seq", "encoder.block")])
def test_freeze_layers_freezes_the_embeddings_and_exactly_the_first_n_layers(task, stack):
    from trainwise.trial import layer_stack, lower_layer_parameters

    model = _tiny_model(task)
    layers = layer_stack(model)
    assert layers is model.get_submodule(stack) and len(layers) >= 2
    apply_model_plan(model, TrialPlan(freeze_layers=1))
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert all(not p.requires_grad for p in layers[0].parameters())
    assert all(p.requires_grad for layer in layers[1:] for p in layer.parameters())
    assert all(not p.requires_grad for p in model.get_input_embeddings().parameters())
    assert not any(n.startswith(f"{stack}.1.") for n in frozen)
    half = {id(p) for p in lower_layer_parameters(_tiny_model(task), -1)}
    assert len(half) < sum(1 for _ in model.parameters())
    with pytest.raises(ValueError, match="only"):
        lower_layer_parameters(model, len(layers) + 1)


@pytest.mark.parametrize("row, attn", [("sdpa", "sdpa"), ("eager_attn", "eager")])
def test_attention_strategies_choose_the_implementation(row, attn):
    plan = strategies.build_plan(row, 4)
    model = build_model(ModelSource("preset", "bert-tiny"), "classification", 2, seed=0, attn=plan.attn)
    assert model.config._attn_implementation == attn


def test_profile_writes_a_chrome_trace_with_the_loop_phases(tmp_path, cls_csv):
    import json

    from .conftest import tiny_study

    study = tiny_study(tmp_path, cls_csv, "classification", ["baseline"], max_steps=2, eval_samples=0)
    trace = tmp_path / "trace.json"
    r = run_trial(study.specs[0], trace_path=trace)
    assert r.status == "ok"
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"data", "forward", "backward", "optimizer"} <= names
    assert sum(e.get("name") == "forward" for e in events) == 2, "one forward range per step"
