"""MFU's parts: the FLOP counter on a known op, the compute dtype of a plan, the cached matmul peak."""

from __future__ import annotations

import pytest
import torch

from trainwise.training.measure import flops


def test_a_matmul_is_counted_as_2mnk_flops():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with flops.counting() as counted:
        torch.mm(a, b)
    assert counted.flops == 2 * 8 * 16 * 4


@pytest.mark.parametrize(
    "mixed, weights, expected",
    [("no", None, "fp32"), ("bf16", None, "bf16"), ("fp16", None, "fp16"), ("no", "bfloat16", "bf16")],
)
def test_the_peak_is_taken_in_the_plans_compute_dtype(mixed, weights, expected):
    assert flops.compute_dtype(mixed, weights) == expected
