"""The image-classification path: the project's ResNeXt, digits / CIFAR-10 / image folders, strategies."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from trainwise.cli import main
from trainwise.core.errors import ConfigError
from trainwise.spec.config import StudyConfig
from trainwise.study.prepare import prepare_study
from trainwise.study.store import read_rows
from trainwise.training.trial import run_trial
from trainwise.training.vision import ResNeXt, load_image_data


def _study(tmp_path, rows, **kw):
    cfg = StudyConfig(
        out=str(tmp_path / "study"),
        strategies=rows,
        task="image-classification",
        batch_size=kw.pop("batch_size", 32),
        max_steps=kw.pop("max_steps", 3),
        warmup_steps=kw.pop("warmup_steps", 1),
        eval_samples=kw.pop("eval_samples", 64),
        device="cpu",
        remeasure=kw.pop("remeasure", False),
        **kw,
    )
    return prepare_study(cfg)


def test_resnext29_8x64d_matches_the_papers_parameter_count():
    """ResNeXt-29 8x64d has the paper's parameter count and grouped convolutions."""
    model = ResNeXt("resnext29-8x64d", 3, 10)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(34.4e6, rel=0.005)  # Xie et al.: 34.4M
    assert len(model.layers) == 9 and all(b.conv2.groups == 8 for b in model.layers)
    tiny = ResNeXt("resnext-tiny", 1, 10)
    assert tiny(torch.zeros(5, 1, 8, 8)).logits.shape == (5, 10)


def test_the_digits_study_is_the_real_sklearn_digits():
    train, evals, names = load_image_data(None, None, None, 32)
    assert len(train) + len(evals) == 1797 and names == [str(i) for i in range(10)]
    assert train.x.shape[1:] == (8, 8, 1) and train.x.dtype == np.uint8 and train.x.max() == 255


@pytest.mark.slow
def test_resnext_learns_digits_past_80_percent(tmp_path):
    study = _study(tmp_path, ["baseline"], max_steps=200, warmup_steps=2, eval_samples=400)
    r = run_trial(study.specs[0])
    assert r.status == "ok" and r.metric_name == "accuracy"
    assert r.metric > 80, f"accuracy {r.metric:.1f}% on held-out digits"
    assert r.padding_waste == 0


def test_channels_last_changes_the_layout_not_the_numbers(tmp_path):
    study = _study(tmp_path, ["baseline", "channels_last", "grad_ckpt"], max_steps=3)
    base, nhwc, ckpt = (run_trial(s) for s in study.specs)
    assert nhwc.plan["channels_last"] and not base.plan["channels_last"]
    assert nhwc.final_loss == pytest.approx(base.final_loss, rel=1e-3)
    assert ckpt.final_loss == pytest.approx(base.final_loss, rel=1e-4), "checkpointing recomputes the same values"


def test_checkpointing_counts_each_batch_once_in_batchnorm():
    """A checkpointed block runs its forward again in the backward; its BatchNorm statistics must not see the batch
    twice, or evaluation (which normalises with them) differs from the run without checkpointing."""
    torch.manual_seed(0)
    plain = ResNeXt("resnext-tiny", 3, 10)
    ckpt = ResNeXt("resnext-tiny", 3, 10)
    ckpt.load_state_dict(plain.state_dict())
    ckpt.gradient_checkpointing_enable()
    x = torch.randn(8, 3, 16, 16)
    for model in (plain, ckpt):
        model.train()
        model(x).logits.sum().backward()
    for (name, a), (_, b) in zip(plain.named_buffers(), ckpt.named_buffers(), strict=True):
        assert torch.equal(a, b), name
    plain.eval(), ckpt.eval()
    assert torch.allclose(plain(x).logits, ckpt(x).logits, atol=1e-6)
    grads = [(p.grad, q.grad) for p, q in zip(plain.parameters(), ckpt.parameters(), strict=True)]
    assert all(torch.allclose(g, h, atol=1e-6) for g, h in grads), "the recomputation's gradients are the same"


def _png_folder(root, classes=("cat", "dog"), n=6, size=(12, 10)):
    from PIL import Image

    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(n):
            arr = np.full((*size[::-1], 3), 40 * k + i, dtype=np.uint8)
            Image.fromarray(arr).save(root / name / f"{i}.png")
    (root / classes[0] / "notes.txt").write_text("not an image, skipped")
    return root


def test_image_folders_and_cifar_directories_load(tmp_path):
    train, evals, names = load_image_data(None, str(_png_folder(tmp_path / "folder")), None, 16)
    assert names == ["cat", "dog"] and len(train) + len(evals) == 12
    assert train.x.shape[1:] == (16, 16, 3)
    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    rng = np.random.default_rng(0)
    for name, n in (("data_batch_1", 20), ("data_batch_2", 20), ("test_batch", 10)):
        with open(cifar / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), "labels": list(range(n))}, f)
    with open(cifar / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    train, evals, names = load_image_data(None, str(cifar), None, 32)
    assert (len(train), len(evals)) == (40, 10) and train.x.shape[1:] == (32, 32, 3) and names[0] == "c0"


class _Payload:
    """What a hostile 'CIFAR batch' carries: unpickling it would run a command."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_cifar_dir_with_code_is_refused_without_running_it(tmp_path, capsys):
    """Issue 17: a user-supplied CIFAR directory is read with an allow-list unpickler (arrays, dicts,
    lists, strings), so a batch that names anything else is one line, exit 2, and nothing is run."""
    from trainwise.cli import main

    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    marker = tmp_path / "ran"
    with open(cifar / "data_batch_1", "wb") as f:
        pickle.dump({"data": _Payload(marker), "labels": [0]}, f)
    with open(cifar / "batches.meta", "wb") as f:
        pickle.dump({"label_names": ["a", "b"]}, f)
    argv = ["compare", "--task", "image-classification", "--strategies", "baseline", "--train-file", str(cifar)]
    argv += ["--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a CIFAR-10 python batch, refused (it names posix.system" in err[0], err
    assert not marker.exists(), "the payload did not run"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"strategies": ["smart_batch"]}, "strategy 'smart_batch' .* applies to causal-lm, classification, seq2seq"),
        ({"strategies": ["all"]}, "applies to causal-lm, classification, seq2seq, not image-classification"),
        ({"model_preset": "bert-tiny"}, "--model-preset one of resnext-tiny"),
        ({"dataset": "mnist"}, "unknown dataset 'mnist'"),
        ({"train_file": "{tmp}/x.csv"}, "reads a directory"),
        ({"batch_size": 5000}, "fewer than the batch size 5000"),
    ],
)
def test_bad_image_input_is_one_error_before_anything_is_written(tmp_path, kw, message):
    (tmp_path / "x.csv").write_text("a,b\n")
    kw = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in kw.items()}
    rows = kw.pop("strategies", ["baseline"])
    with pytest.raises(ConfigError, match=message):
        _study(tmp_path, rows, **kw)
    assert not (tmp_path / "study").exists()


def test_channels_last_on_text_is_rejected(tmp_path, cls_csv):
    from tests.conftest import tiny_study

    with pytest.raises(ConfigError, match="'channels_last' .* applies to image-classification, not classification"):
        tiny_study(tmp_path, cls_csv, "classification", ["channels_last"])


@pytest.mark.slow
def test_seed_003_shaped_study_from_one_command(tmp_path, capsys):
    """Workers x precision x checkpointing x batch size, one command, seed 003's columns (bf16 and
    checkpointing in one row to keep CI short: each image strategy alone is test_every_image_strategy_trains)."""
    out = tmp_path / "s003"
    argv = ["compare", "--task", "image-classification", "--strategies", "baseline,bf16+grad_ckpt"]
    argv += ["--num-workers", "0,2", "--batch-sizes", "16,64", "--max-steps", "4", "--warmup-steps", "1"]
    argv += ["--out", str(out), "--eval-samples", "64", "--no-remeasure"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for column in ("data (s)", "step (s)", "optim (s)", "epoch (s)", "peak mem"):
        assert column in printed
    rows = read_rows(out / "results.json")
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
    assert {r["strategy"] for r in rows} >= {"baseline @bs16 @w0", "bf16+grad_ckpt @bs64 @w2"}
