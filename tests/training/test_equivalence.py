"""Equivalence: batch 8 == batch 2 x accumulation 4 (loss and grads), and bf16 close to fp32."""

from __future__ import annotations

import pytest
import torch

from trainwise.training.data.tasks import Collator
from trainwise.training.loop import accumulate_step
from trainwise.training.models import ModelSource, build_model
from trainwise.training.trial import run_trial


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


PRESETS = {"classification": "bert-tiny", "seq2seq": "t5-tiny", "causal-lm": "llama-tiny"}
NO_DROPOUT = {
    "classification": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "seq2seq": {"dropout_rate": 0.0},
    "causal-lm": {"attention_dropout": 0.0},
}


def _target(task: str, i: int, ids: list[int], g: torch.Generator):
    if task == "classification":
        return i % 3
    if task == "seq2seq":
        return torch.randint(5, 1000, (1 + i % 4,), generator=g).tolist()
    prompt = 1 + i % 3  # causal-lm: labels aligned with the inputs, -100 on a prompt of varied length
    return [-100] * prompt + ids[prompt:]


@pytest.mark.parametrize("task", ["classification", "seq2seq", "causal-lm"])
def test_batch8_equals_batch2_times_accum4(task):
    torch.manual_seed(0)
    model = build_model(ModelSource("preset", PRESETS[task]), task, 3, seed=0, config_overrides=NO_DROPOUT[task])
    model.train()
    g = torch.Generator().manual_seed(1)
    items = []
    for i in range(8):  # different lengths: micro-batches pad differently, the mean must not change
        ids = torch.randint(5, 1000, (3 + 2 * i,), generator=g).tolist()
        items.append((ids, _target(task, i, ids, g)))
    collate = Collator(task, 0, "longest", 64, 8)
    dec = model.prepare_decoder_input_ids_from_labels if task == "seq2seq" else None

    def run(micro):
        model.zero_grad(set_to_none=True)
        loss = accumulate_step(model, micro, lambda loss: loss.backward(), task, dec)
        return float(loss), _grads(model)

    loss_full, grads_full = run([collate(items)])
    loss_acc, grads_acc = run([collate(items[i : i + 2]) for i in range(0, 8, 2)])
    assert loss_acc == pytest.approx(loss_full, rel=1e-4)
    assert grads_full.keys() == grads_acc.keys() and grads_full
    for name, grad in grads_full.items():
        torch.testing.assert_close(grads_acc[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_unequal_token_counts_are_averaged_over_the_whole_window():
    """A window's loss is total loss / total items, not the mean of micro-batch means."""
    model = build_model(ModelSource("preset", "t5-tiny"), "seq2seq", 2, seed=0, config_overrides={"dropout_rate": 0.0})
    collate = Collator("seq2seq", 0, "longest", 16, 8)
    a, b = collate([([5, 6, 7], [8])]), collate([([9, 10], [11, 12, 13, 14, 15, 16, 17])])
    dec = model.prepare_decoder_input_ids_from_labels
    window = float(accumulate_step(model, [a, b], lambda loss: None, "seq2seq", dec))
    per_item = [float(accumulate_step(model, [x], lambda loss: None, "seq2seq", dec)) for x in (a, b)]
    assert window == pytest.approx((per_item[0] * 1 + per_item[1] * 7) / 8, rel=1e-5)
    assert window != pytest.approx(sum(per_item) / 2, rel=1e-3)


def test_bf16_trains_close_to_fp32(tmp_path, cls_csv):
    from tests.conftest import tiny_study

    study = tiny_study(
        tmp_path, cls_csv, "classification", ["baseline", "bf16"], max_steps=4, warmup_steps=1, eval_samples=0
    )
    fp32, bf16 = (run_trial(s) for s in study.specs)
    assert bf16.plan["precision"] == "bf16"
    assert bf16.final_loss == pytest.approx(fp32.final_loss, rel=0.05)
    assert bf16.final_loss != fp32.final_loss, "bf16 really ran in lower precision"


def test_the_lr_schedule_is_transformers_linear_warmup():
    """The loop writes transformers' get_linear_schedule_with_warmup factor itself (importing it costs every
    process peft and bitsandbytes): the same learning rate at every step, edge cases included."""
    import functools

    import torch
    from transformers import get_linear_schedule_with_warmup

    from trainwise.training.loop import linear_warmup_decay

    for warmup, total in [(0, 10), (3, 10), (1, 1), (5, 5), (2, 7), (0, 0)]:
        layer = torch.nn.Linear(2, 2)
        ours_opt, theirs_opt = (torch.optim.SGD(layer.parameters(), lr=1.0) for _ in range(2))
        theirs = get_linear_schedule_with_warmup(theirs_opt, warmup, total)
        ours = torch.optim.lr_scheduler.LambdaLR(
            ours_opt, functools.partial(linear_warmup_decay, warmup=warmup, total=total)
        )
        for _ in range(total + 2):
            assert ours.get_last_lr() == theirs.get_last_lr(), (warmup, total)
            for sched, opt in ((ours, ours_opt), (theirs, theirs_opt)):
                opt.step()
                sched.step()
