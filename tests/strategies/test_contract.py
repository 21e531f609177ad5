"""Contract: every registered strategy trains through the one loop, and what `compare` measures is what
`train` runs: the same loss at every step, for every entry this machine can run (CUDA entries under the
`gpu` marker, ZeRO entries under torchrun). Then each strategy's effect, where it is observable."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import in_process_rows, tiny_study
from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.run.events import Step
from trainwise.strategies.freezing import apply_lora, frozen_parameters, layer_stack, lower_layer_parameters
from trainwise.strategies.optim import OPTIMIZERS
from trainwise.training import loop
from trainwise.training.fit import TrainConfig, TrainJob, run_train
from trainwise.training.models import ModelSource, build_model
from trainwise.training.trial import run_trial

TEXT = in_process_rows("classification") + list(strategies.ALIASES)
CUDA_ONLY = [r for r in in_process_rows("classification", "cuda") if r not in TEXT]
IMAGE = in_process_rows("image-classification")
# torch.compile: Inductor's code generation takes tens of seconds per run on this CPU. CI runs the row with Dynamo's
# eager backend (the model traced, wrapped and unwrapped as with Inductor: every trainwise seam); `make bench` runs
# it with Inductor, the generated kernels too
SLOW = {"compile"}


def _spec(study, row):
    return next(s for s in study.specs if s.row == row)


def _compare_and_train(spec, out: Path) -> tuple[list[float], list[float], object]:
    """The step losses of compare's trial and of train's run of the same spec (train evaluates every step)."""
    measured: list[float] = []
    r = run_trial(spec, progress=lambda e: measured.append(e.loss) if isinstance(e, Step) else None)
    trained: list[float] = []
    tc = TrainConfig(epochs=10, max_steps=spec.steps, eval_every=1, save_every=1, checkpoints=False)
    on_event = lambda e: trained.append(e.loss) if isinstance(e, Step) else None  # noqa: E731
    run_train(TrainJob(spec, tc, out), on_event)
    return measured, trained, r


def _check(row: str, r, measured: list[float], trained: list[float]) -> None:
    assert r.status == "ok"
    assert r.plan == strategies.parse_row(row, 4).plan.to_dict()
    assert r.timed_steps >= 1 and r.step_time_s > 0 and r.samples_per_s > 0
    assert all(math.isfinite(x) and 0 < x < 10 for x in measured)
    assert trained == measured, f"{row}: train {trained} != compare {measured}"


@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.slow) if r in SLOW else r for r in TEXT])
def test_compare_and_train_take_the_same_steps(cls_study, tmp_path, row, monkeypatch):
    if row == "compile":
        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    measured, trained, r = _compare_and_train(_spec(cls_study, row), tmp_path)
    _check(row, r, measured, trained)
    assert r.metric_name == "accuracy" and 0 <= r.metric <= 100
    assert r.env["torch"] == torch.__version__ and r.env["device"] == "cpu"
    assert 0 <= r.padding_waste < 1
    if row == "lora":
        assert r.n_trainable / r.n_params < 0.2, "only the adapters and the head train"
    else:
        assert (r.n_trainable < r.n_params) == ("freeze" in row)


@pytest.mark.bench
def test_inductor_compile_takes_the_same_steps(cls_study, tmp_path):
    """The compile row as a user runs it: Inductor's kernels (38 s of a fresh clone's suite on 2 cores)."""
    measured, trained, r = _compare_and_train(_spec(cls_study, "compile"), tmp_path)
    _check("compile", r, measured, trained)
    assert r.compile_s is not None and r.compile_s > 0


# torch.compile on images: 17.6 s of a fresh clone's compiling (its text row, the same seam, stays in CI): `make bench`
@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.bench) if r in SLOW else r for r in IMAGE])
def test_image_strategies_take_the_same_steps(tmp_path, row):
    """Image strategies take the same steps in compare and train."""
    from trainwise.spec.config import StudyConfig
    from trainwise.study.prepare import prepare_study

    kw = {"batch_size": 32, "max_steps": 2, "warmup_steps": 1, "eval_samples": 32, "device": "cpu"}
    study = prepare_study(StudyConfig(str(tmp_path / "s"), [row], task="image-classification", **kw))
    measured, trained, r = _compare_and_train(study.specs[0], tmp_path / "t")
    _check(row, r, measured, trained)


# causal LM (issue 26): the rows only a causal LM has, LoRA on its projections, and all of them together
LM = [
    "baseline",
    "bf16",
    "grad_ckpt",
    "lora",
    "packing",
    "padding_free",
    "chunked_ce",
    "bf16+grad_ckpt+lora+packing+chunked_ce",
]


@pytest.fixture(scope="module")
def lm_study(tmp_path_factory):
    from tests.conftest import make_rows, write_csv
    from trainwise.spec.config import StudyConfig
    from trainwise.study.prepare import prepare_study

    where = tmp_path_factory.mktemp("lm-contract")
    csv = write_csv(where / "pr.csv", make_rows(48, "seq2seq"))  # text -> target: prompt -> response
    kw = {"batch_size": 8, "max_steps": 3, "warmup_steps": 1, "eval_samples": 8, "device": "cpu", "max_length": 48}
    cols = {"prompt_column": "text", "response_column": "target", "train_file": str(csv)}
    return prepare_study(StudyConfig(str(where / "s"), LM, task="causal-lm", model_preset="llama-tiny", **cols, **kw))


@pytest.mark.parametrize("row", LM)
def test_causal_lm_strategies_take_the_same_steps(lm_study, tmp_path, row):
    """Causal-LM strategies take the same steps in compare and train."""
    measured, trained, r = _compare_and_train(_spec(lm_study, row), tmp_path)
    _check(row, r, measured, trained)
    assert r.metric_name == "neg_eval_loss" and 0 < r.loss_token_share < 1


@pytest.mark.gpu
@pytest.mark.parametrize("row", CUDA_ONLY)
def test_cuda_strategies_take_the_same_steps(tmp_path, cls_csv, row):
    """CUDA strategies take the same steps in compare and train."""
    missing = strategies.parse_row(row, 2).missing_packages()
    if missing:  # the H200 image of 2026-11-26 had no bitsandbytes: adamw_8bit needs it, the others do not
        pytest.skip(f"{row} needs {', '.join(missing)}")
    study = tiny_study(tmp_path / "s", cls_csv, "classification", [row], device="cuda", max_steps=2)
    measured, trained, r = _compare_and_train(study.specs[0], tmp_path / "t")
    _check(row, r, measured, trained)
    assert r.mem_kind == "cuda_allocated" and r.peak_reserved_bytes >= r.peak_mem_bytes > 0


# What each ZeRO entry adds: stage 1 shards the optimizer state, 2 the gradients too (zero2 also trains over 2 ranks
# in test_distributed.py and test_train.py), 3 the weights; offload steps the optimizer in DeepSpeed's CPU Adam (a C++
# op it builds on first use: 90 s on 2 cores on a new machine) and, at stage 3, keeps the weights in CPU memory. CI
# runs the three stages; `make bench` (the `bench` marker) every entry, the two offloads too.
ZERO_CI = ("zero1", "zero2", "zero3")


@pytest.mark.parametrize(
    "rows",
    [
        pytest.param(ZERO_CI, marks=pytest.mark.slow, id="the-stages"),
        pytest.param(strategies.scale.ZERO, marks=pytest.mark.bench, id="every-entry"),
    ],
)
def test_zero_rows_take_the_same_steps_under_torchrun(tmp_path, cls_csv, rows):
    """ZeRO entries over 2 gloo ranks (DeepSpeed on CPU): compare's trial and train's run, one torchrun. DeepSpeed
    builds its C++ ops into TORCH_EXTENSIONS_DIR, here a new one, as on a new machine: training builds no
    `deepspeed_shm_comm` (only DeepSpeed's inference all-reduce uses it; a 55 s build on 2 cores)."""
    study = tiny_study(tmp_path, cls_csv, "classification", list(rows), nproc=2, max_steps=2)
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps([s.to_dict() for s in study.specs]))
    ext = tmp_path / "torch_extensions"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TORCH_EXTENSIONS_DIR": str(ext)}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    argv += ["-m", "tests.ranks", str(specs), str(tmp_path / "losses.json")]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert set(losses) == set(rows)
    for row, (measured, trained, state_bytes, n_params) in losses.items():
        assert trained == measured and all(math.isfinite(x) for x in measured), row
        assert state_bytes < 16 * n_params, f"{row}: the state each rank holds shrinks (16 B/param without ZeRO)"
    assert losses["zero1"][0] == pytest.approx(losses["zero2"][0], rel=1e-5), "stages 1 and 2 take the same steps"
    assert not list(ext.rglob("deepspeed_shm_comm*")), "training built DeepSpeed's shared-memory all-reduce"


@pytest.mark.parametrize("row", ["baseline", "all"])
def test_seq2seq_trains_and_reports_rouge_and_bleu(s2s_study, row):
    r = run_trial(_spec(s2s_study, row))
    assert r.status == "ok" and r.metric_name == "rougeL"
    captioning = {"cider"} if importlib.util.find_spec("pycocoevalcap") else set()  # the lock's optional extra
    expected = {"rouge1", "rouge2", "rougeL", "bleu", "bleu1", "bleu2", "bleu3", "bleu4", "eval_loss", *captioning}
    assert set(r.metrics) == expected
    assert math.isfinite(r.train_loss)


# ---- effects ------------------------------------------------------------------------------------------------


def _tiny_model(task="classification"):
    preset = "bert-tiny" if task == "classification" else "t5-tiny"
    return build_model(ModelSource("preset", preset), task, 2, seed=0)


def _applied(model, text: str, task: str = "classification"):
    return loop.apply_plan(model, strategies.runtime(strategies.parse_row(text, 4).plan, task, "cpu"))


def test_grad_ckpt_turns_on_checkpointing():
    assert _applied(_tiny_model(), "grad_ckpt").is_activation_checkpointing
    assert not _applied(_tiny_model(), "baseline").is_activation_checkpointing


@pytest.mark.parametrize("task", ["classification", "seq2seq"])
def test_freezing_freezes_exactly_the_named_part(task):
    model = _applied(_tiny_model(task), "freeze_embeddings", task)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all("embed" in n or "shared" in n for n in frozen)
    model = _applied(_tiny_model(task), "freeze_encoder", task)
    encoder_ids = {id(p) for p in frozen_parameters(model, "encoder")}
    assert all(not p.requires_grad for p in model.parameters() if id(p) in encoder_ids)
    assert any(p.requires_grad for p in model.parameters()), "the head still trains"


def test_lora_adapts_only_the_attention_projections_and_the_head():
    for task in ("classification", "seq2seq"):
        model = apply_lora(_tiny_model(task), 4, task)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert any("lora_A" in n for n in trainable) and any("lora_B" in n for n in trainable)
        assert all("lora_" in n or "classifier" in n for n in trainable), trainable


def test_lora_peft_cannot_target_is_one_line_before_training(tmp_path, cls_csv):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    from trainwise.core.errors import ConfigError
    from trainwise.training.models import train_tokenizer

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
        opt = OPTIMIZERS[name].build(list(model.parameters()), 1e-3, 0.0)
        model(input_ids=torch.ones(2, 4, dtype=torch.long)).logits.sum().backward()
        opt.step()
        after[name] = torch.cat([p.detach().flatten() for p in model.parameters()])
        group = opt.param_groups[0]
        assert group["foreach"] is (True if name == "adamw_foreach" else None)
        assert group["fused"] is (True if name == "adamw_fused" else None)
    torch.testing.assert_close(after["adamw_foreach"], after["adamw"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(after["adamw_fused"], after["adamw"], rtol=1e-5, atol=1e-6)


def test_state_bytes_count_weights_grads_and_optimizer_state(tmp_path, cls_csv):
    """AdamW keeps exp_avg + exp_avg_sq (8 bytes/param) that Adafactor factors away; freezing drops the
    frozen parameters' grads and state. The counted state shows exactly that."""
    rows = ["baseline", "adafactor", "freeze_encoder"]
    study = tiny_study(tmp_path, cls_csv, "classification", rows, eval_samples=0, max_steps=2, warmup_steps=1)
    adamw, adafactor, frozen = (run_trial(spec) for spec in study.specs)
    n = adamw.n_params
    assert adamw.state_bytes == pytest.approx(4 * n + 4 * n + 8 * n, rel=0.01)
    assert adamw.state_bytes - adafactor.state_bytes == pytest.approx(8 * n, rel=0.1)
    assert adamw.state_bytes - frozen.state_bytes == pytest.approx(12 * (n - frozen.n_trainable), rel=0.01)


def test_bf16_pure_keeps_no_fp32_copy(cls_study):
    """bf16_pure: weights, gradients and AdamW state in bf16, no autocast, no fp32 master; half the state."""
    from tests.search.test_memory import _shape
    from trainwise.estimating.peak import state_parts
    from trainwise.estimating.shapes import terms_of
    from trainwise.training.data.prepared import load_data

    spec = _spec(cls_study, "bf16_pure")
    data = load_data(spec)
    parts = loop.build(spec, data, 2)
    loop.run(parts, loop.Stream(data, parts), 2, lambda loss, micro: None)
    dtypes = {p.dtype for p in parts.raw_model.parameters()}
    states = {t.dtype for s in parts.optimizer.state.values() for t in s.values() if t.dim() > 0}
    assert dtypes == {torch.bfloat16} and states == {torch.bfloat16}
    assert parts.accelerator.mixed_precision == "no", "no autocast: the weights themselves are bf16"
    pure, base = run_trial(spec), run_trial(_spec(cls_study, "baseline"))
    assert pure.state_bytes == pytest.approx(base.state_bytes / 2, rel=0.01), "bf16 weights, grads, AdamW state"
    # the estimate: 2 B weights and grads, AdamW's two states at 2 B; HF Adafactor keeps fp32 factors
    shape = _shape(buffer_bytes=40)
    terms = terms_of(strategies.parse_row("bf16_pure", 4).plan, "cpu")
    assert state_parts(shape, terms)[0] == {"weights": 2000 + 40, "grads": 2000, "optimizer": 4000}
    ada = terms_of(strategies.parse_row("bf16_pure+adafactor", 4).plan, "cpu")
    assert state_parts(shape, ada)[0]["optimizer"] == 4 * 150 and not terms.autocast_copies
    # export: the snippet loads the model in bf16 and says why TrainingArguments cannot
    from trainwise.exporting.arguments import RunSettings, export_doc

    doc = export_doc(strategies.parse_row("bf16_pure", 4).plan, RunSettings("m", "classification", 8, 16, 8, 1e-4, 2))
    assert doc.model_kwargs == {"dtype": "torch.bfloat16"} and doc.args["bf16"] is False
    assert any(n.startswith("bf16_pure: no TrainingArguments field") for n in doc.notes)
    for clash in ("bf16+bf16_pure", "bf16_pure+zero2"):
        with pytest.raises(ConfigError, match="conflict"):
            strategies.parse_row(clash, 4)


@pytest.mark.parametrize("task, stack", [("classification", "bert.encoder.layer"), ("seq2seq", "encoder.block")])
def test_freeze_layers_freezes_embeddings_and_the_first_n(task, stack):
    """freeze_layers freezes the embeddings and exactly the first n layers."""
    model = _tiny_model(task)
    layers = layer_stack(model)
    assert layers is model.get_submodule(stack) and len(layers) >= 2
    model = _applied(model, "freeze_layers=1", task)
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
    rt = strategies.runtime(strategies.parse_row(row, 4).plan, "classification", "cpu")
    model = build_model(ModelSource("preset", "bert-tiny"), "classification", 2, seed=0, **rt.model_kwargs)
    assert model.config._attn_implementation == attn


def test_profile_writes_a_chrome_trace_with_the_loop_phases(tmp_path, cls_csv):
    study = tiny_study(tmp_path, cls_csv, "classification", ["baseline"], max_steps=2, eval_samples=0)
    trace = tmp_path / "trace.json"
    r = run_trial(study.specs[0], trace_path=trace)
    assert r.status == "ok"
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"data", "forward", "backward", "optimizer"} <= names
    assert sum(e.get("name") == "forward" for e in events) == 2, "one forward range per step"


def test_the_optimizer_steps_in_one_place():
    """One loop: `optimizer.step()` appears in trainwise/training/loop.py and nowhere else in the package."""
    root = Path(loop.__file__).parents[1]  # the package
    places = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py")) if "optimizer.step()" in p.read_text()]
    assert places == ["training/loop.py"]
