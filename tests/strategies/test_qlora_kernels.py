"""Issue 26's last causal-LM rows: qlora (4-bit NF4 base weights through bitsandbytes, LoRA adapters on top), which
bitsandbytes 0.50.2 trains on a CPU too, and the CUDA-only kernels liger and cce, which a CPU records as unsupported
(never a crash) while the rest of the study runs.

The liger / cce runtimes (Triton kernels) cannot run here: what is checked on a CPU is everything around them.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from tests.conftest import write_csv
from tests.training.test_causal_lm import pairs
from trainwise import strategies
from trainwise.cli import main
from trainwise.core.device import DeviceFacts
from trainwise.core.errors import ConfigError
from trainwise.exporting.arguments import RunSettings
from trainwise.exporting.scripts import write_export
from trainwise.study.store import read_rows
from trainwise.training.loop import apply_plan, loss_sum
from trainwise.training.models import ModelSource, build_model, meta_model, model_config

LM = ["compare", "--task", "causal-lm", "--model-preset", "llama-tiny", "--prompt-column", "question"]
LM += ["--response-column", "answer", "--batch-size", "8", "--max-length", "32", "--max-steps", "2"]
LM += ["--warmup-steps", "1", "--eval-samples", "0", "--retries", "0", "--no-remeasure"]
PRESET = RunSettings("llama-tiny", "causal-lm", 8, 32, 32, 1e-3, 10, model_is_preset=True)


@pytest.fixture(scope="module")
def pr_csv(tmp_path_factory):
    return write_csv(tmp_path_factory.mktemp("qlora") / "pr.csv", pairs(32))


def _qlora_model(row: str = "qlora"):
    plan = strategies.parse_row(row, 4).plan
    rt = strategies.runtime(plan, "causal-lm", "cpu")
    model = build_model(ModelSource("preset", "llama-tiny"), "causal-lm", 2, seed=0, **rt.model_kwargs)
    return apply_plan(model, rt), rt


def test_qlora_quantizes_to_nf4_and_trains_only_the_adapters():
    """QLoRA quantizes every projection to NF4 and trains only the adapters."""
    bnb = pytest.importorskip("bitsandbytes")  # in requirements.lock; an environment without it skips
    model, rt = _qlora_model()
    base = model.get_base_model()
    layers = [m for m in base.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 2 * 7, "q, k, v, o, gate, up, down in each of llama-tiny's 2 layers"
    assert all(layer.weight.dtype == torch.uint8 and layer.weight.quant_state.quant_type == "nf4" for layer in layers)
    assert all(layer.compute_dtype == torch.float32 for layer in layers), "an fp32 row computes in fp32"
    assert type(base.get_output_embeddings()) is not bnb.nn.Linear4bit, "the head stays as it is"
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * len(layers)
    # one optimizer step: a finite loss, gradients on the adapters only, and the adapters move
    ids = torch.randint(5, 1024, (4, 16), generator=torch.Generator().manual_seed(0))
    batch = type("B", (), {"inputs": {"input_ids": ids}, "labels": ids})()
    loss = loss_sum(model, batch, "causal-lm", None)
    loss.backward()
    assert torch.isfinite(loss)
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and grads <= set(trainable)
    assert all(layer.weight.grad is None for layer in layers)


def test_qlora_computes_in_the_rows_precision():
    bnb = pytest.importorskip("bitsandbytes")
    model, _ = _qlora_model("bf16+qlora")
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(layer.compute_dtype == torch.bfloat16 for layer in layers)


def test_qlora_applies_on_the_meta_device():
    """QLoRA applies on the meta device, as the study's check and the estimate run it."""
    bnb = pytest.importorskip("bitsandbytes")
    rt = strategies.runtime(strategies.parse_row("qlora", 4).plan, "causal-lm", "cpu")
    model = apply_plan(meta_model(model_config(ModelSource("preset", "llama-tiny"), "causal-lm", 2), "causal-lm"), rt)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())


@pytest.mark.parametrize(
    "row, conflict", [("qlora+lora", "lora"), ("qlora+freeze_layers", "freeze_layers"), ("zero3+qlora", "qlora")]
)
def test_qlora_conflicts_are_data(row, conflict):
    with pytest.raises(ConfigError, match=re.escape(f"conflict in '{row}'")):
        strategies.parse_row(row, 4)


def test_the_cuda_kernels_say_needs_cuda_only_on_a_cpu():
    cpu = DeviceFacts("cpu", "Intel Xeon", frozenset({"avx512_bf16"}))
    gpu = DeviceFacts("cuda", "H100", frozenset(), (9, 0))
    for name, row in (("liger", "liger"), ("cce", "bf16+cce")):
        plan = strategies.parse_row(row, 4).plan
        verdict = strategies.support(plan, cpu)["lm_loss"]
        assert (
            verdict.status == "unsupported"
            and verdict.line() == f"{name} unsupported on CPU: needs CUDA (Triton kernels)"
        )
        assert "lm_loss" not in strategies.support(plan, gpu)
        assert strategies.parse_row(row, 4).missing_capabilities({"bf16"}) == ["cuda"]
    for row in ("liger+chunked_ce", "bf16+cce+chunked_ce", "bf16+liger+cce"):
        with pytest.raises(ConfigError, match="conflict"):
            strategies.parse_row(row, 4)


def test_cce_alone_is_refused_it_needs_a_16_bit_precision():
    """On an H200, cce alone (fp32) failed every step: "Backwards requires embeddings to be bf16 or fp16" (issue 53).
    It is invalid alone, before any trial; beside bf16 or fp16 it parses."""
    with pytest.raises(ConfigError) as e:
        strategies.parse_row("cce", 4)
    assert str(e.value) == (
        "'cce' in 'cce' runs only beside bf16 or bf16_pure or fp16 (its kernels take 16-bit embeddings): write bf16+cce"
    )
    for row in ("bf16+cce", "fp16+cce", "bf16_pure+cce@bs32"):
        assert strategies.parse_row(row, 4).plan.value("lm_loss") == "cce"


def test_a_cpu_study_records_cuda_kernels_unsupported(tmp_path, pr_csv, capsys):
    """A CPU study records the CUDA kernels unsupported and runs the rest."""
    out = tmp_path / "s"
    assert main([*LM, "--train-file", str(pr_csv), "--strategies", "baseline,liger,bf16+cce", "--out", str(out)]) == 0
    rows = {r["strategy"]: r for r in read_rows(out / "results.json")}
    assert rows["baseline"]["status"] == "ok"
    for name in ("liger", "bf16+cce"):
        assert rows[name]["status"] == "unsupported" and "needs cuda" in rows[name]["message"], rows[name]
    # only a CUDA-only row: nothing ran, said in one line (exit 1: the study ran, no row could)
    assert main([*LM, "--train-file", str(pr_csv), "--strategies", "liger", "--out", str(tmp_path / "t")]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "trainwise: error: every trial failed (1 unsupported); see the table above"


def test_the_catalogue_lists_the_new_rows_effect_and_cost(capsys):
    assert main(["strategies", "--markdown"]) == 0
    text = capsys.readouterr().out
    for name in ("qlora", "liger", "cce"):
        line = next(ln for ln in text.splitlines() if f"`{name}`" in ln or f"| {name} " in ln)
        assert strategies.REGISTRY[name].summary.split(";")[0][:40] in line, line


def test_export_liger_sets_use_liger_kernel_in_both_files(tmp_path):
    write_export(strategies.parse_row("liger", 2).plan, PRESET, tmp_path)
    assert json.loads((tmp_path / "sft_config.json").read_text())["use_liger_kernel"] is True
    assert json.loads((tmp_path / "training_args.json").read_text())["use_liger_kernel"] is True


def test_export_qlora_and_cce_snippets_load_and_patch(tmp_path):
    write_export(strategies.parse_row("bf16+qlora", 2).plan, PRESET, tmp_path / "q")
    for name in ("sft_train.py", "train_snippet.py"):
        text = (tmp_path / "q" / name).read_text()
        compile(text, name, "exec")
        assert "from transformers import BitsAndBytesConfig" in text
        assert 'bnb_4bit_quant_type="nf4"' in text and "bnb_4bit_compute_dtype=torch.bfloat16" in text
        # a preset: built from its config, then saved and reloaded quantized (from_config cannot quantize)
        assert text.index("from_config(config") < text.index('from_pretrained("preset_base", quantization_config=')
        assert text.index("quantization_config=") < text.index("get_peft_model(")
    write_export(strategies.parse_row("bf16+cce", 2).plan, PRESET, tmp_path / "c")
    text = (tmp_path / "c" / "train_snippet.py").read_text()
    assert "model = cce_patch(model)" in text and "git+https://github.com/apple/ml-cross-entropy" in text
