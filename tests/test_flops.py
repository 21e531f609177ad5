"""MFU's parts: the FLOP counter on a known op, the compute dtype of a plan, the cached matmul peak."""

from __future__ import annotations

import pytest
import torch

from trainwise.measure import flops


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


def test_the_matmul_peak_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    from trainwise.measure import contention

    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    quiet = {"other_cpu_share": 0.0, "steal_share": 0.0, "contended": False}
    monkeypatch.setattr(contention, "between", lambda *_a, **_k: quiet)  # a busy CI machine would not cache
    first = flops.matmul_peak("cpu", "fp32", budget_s=0.05)
    assert 1e8 < first < 1e14, "a CPU does between 0.1 GFLOP/s and 100 TFLOP/s"
    assert list((tmp_path / "peak").glob("*.json")), "cached"

    def no_matmul(*_a, **_k):
        raise AssertionError("measured again")

    monkeypatch.setattr(torch, "mm", no_matmul)
    assert flops.matmul_peak("cpu", "fp32") == first


def test_a_probe_taken_under_load_is_not_cached(tmp_path, monkeypatch):
    """Beside a busy process the probe read a third of this machine's peak; cached, every later MFU
    would have been 3x too high. A contended probe is used once and measured again next time."""
    from trainwise.measure import contention

    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    loaded = {"other_cpu_share": 0.5, "steal_share": 0.0, "contended": True}
    monkeypatch.setattr(contention, "between", lambda *_a, **_k: loaded)
    assert flops.matmul_peak("cpu", "fp32", budget_s=0.05) > 0
    assert not (tmp_path / "peak").exists()
