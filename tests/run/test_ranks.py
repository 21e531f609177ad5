"""Data parallel (--nproc, torchrun + gloo) and DeepSpeed ZeRO trials, and how ranks combine."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import tiny_study
from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.core.results import TrialResult, combine_ranks
from trainwise.strategies.batching.samplers import RandomBatches, RankShard
from trainwise.training.job import launch


def _rank(i: int, **kw) -> TrialResult:
    base = dict(
        strategy="baseline",
        status="ok",
        step_time_s=1.0 + i,
        samples_per_s=8.0 / (1.0 + i),
        tokens_per_s=80.0 / (1.0 + i),
        timed_s=3.0 * (1.0 + i),
        epoch_time_s=100 * (1.0 + i) / 8.0,  # 100 training samples
        peak_mem_bytes=1000 * (i + 1),
        padding_waste=0.5 if i == 0 else 0.0,
        state_bytes=500,
        train_loss=1.25,
        world_size=2,
    )
    base.update(kw)
    return TrialResult(**base)


def test_ranks_combine_to_slowest_time_and_all_samples():
    """Ranks combine to the slowest time, all the samples and each rank's memory."""
    r = combine_ranks([_rank(0), _rank(1)], 2)
    assert r.status == "ok" and r.world_size == 2
    assert r.step_time_s == 2.0, "a step is as slow as its slowest rank"
    # per step at each rank's median step: rank 0 8 samples/s x 1 s = 8 samples; rank 1 4 x 2 s = 8;
    # 16 samples over the slowest rank's 2 s step
    assert r.samples_per_s == pytest.approx(16 / 2)
    assert r.tokens_per_s == pytest.approx(160 / 2)
    # rank 0: 240 real tokens of 480 computed; rank 1: 240 of 240 -> 240 padding of 720 positions
    assert r.padding_waste == pytest.approx(240 / 720)
    assert r.epoch_time_s == pytest.approx(100 / 8)
    assert r.peak_mem_bytes == 2000 and r.rank_peak_mem_bytes == [1000, 2000]
    assert r.train_loss == 1.25


def test_a_failed_or_missing_rank_fails_the_row():
    failed = combine_ranks([_rank(0), _rank(1, status="oom", message="CUDA out of memory")], 2)
    assert failed.status == "oom" and failed.message == "rank 1: CUDA out of memory"
    missing = combine_ranks([_rank(0), None], 2)
    assert missing.status == "crashed" and "rank 1 of 2 ended without a result" in missing.message
    wrong = combine_ranks([_rank(0, world_size=1), _rank(1, world_size=1)], 2)
    assert wrong.status == "error" and "asked for 2 processes, the process group had 1" in wrong.message


def test_unwrap_removes_wrappers_and_keeps_compile_on_top():
    """What accelerate's unwrap_model returns, without importing deepspeed to ask (3 s of every trial's start)."""
    import subprocess
    import sys

    from trainwise.run.ranks import unwrap

    inner = torch.nn.Linear(2, 2)
    assert unwrap(inner) is inner
    assert unwrap(torch.nn.DataParallel(torch.nn.DataParallel(inner))) is inner
    compiled = torch.compile(torch.nn.DataParallel(inner))
    assert unwrap(compiled) is compiled and compiled._orig_mod is inner
    code = "import sys, torch; from trainwise.run.ranks import unwrap; unwrap(torch.nn.Linear(2, 2)); "
    code += "print('deepspeed' in sys.modules)"
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert seen.strip() == "False"


def test_rank_shards_partition_the_single_process_batches():
    inner = RandomBatches(list(range(40)), 8, seed=3)
    shards = [list(RankShard(RandomBatches(list(range(40)), 8, seed=3), r, 2)) for r in range(2)]
    for full, a, b in zip(inner, *shards, strict=True):
        assert len(a) == len(b) == 4 and not set(a) & set(b)
        assert sorted(a + b) == sorted(full)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _window_on_rank(rank: int, world: int, port: int, task: str, accum: int, out: str) -> None:
    """One optimizer window through the real loop pieces (accelerate DDP, no_sync, loss scaling)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    result = _window(rank, world, task, accum)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    torch.distributed.destroy_process_group()


def _window(rank: int, world: int, task: str, accum: int) -> dict:
    """The loss and gradients of one window of 8 samples, this rank's share of them (world 1: all, no group)."""
    from types import SimpleNamespace

    from trainwise.training import loop

    model, batches = _model_and_batches(task)
    plan = strategies.parse_row("grad_accum" if accum > 1 else "baseline", accum).plan
    rt = strategies.runtime(plan, task, "cpu")
    acc = loop.new_accelerator(rt, 1, 1.0)
    model = acc.prepare(model)
    dec = acc.unwrap_model(model).prepare_decoder_input_ids_from_labels if task == "seq2seq" else None
    spec = SimpleNamespace(settings=SimpleNamespace(task=task, label_smoothing=0.0))  # what train_window reads
    parts = loop.Parts(spec, rt, acc, model, None, None, [], world, dec)  # type: ignore[arg-type]
    micro_size = 8 // accum
    micro = [_collate(task)(batches[i : i + micro_size][rank::world]) for i in range(0, 8, micro_size)]
    loss = loop.train_window(parts, micro)
    grads = {n: p.grad.tolist() for n, p in acc.unwrap_model(model).named_parameters() if p.grad is not None}
    return {"loss": loss, "grads": grads}


def _collate(task):
    from trainwise.training.data.tasks import Collator

    return Collator(task, 0, "longest", 64, 8)


def _model_and_batches(task):
    from trainwise.training.models import ModelSource, build_model

    preset = "bert-tiny" if task == "classification" else "t5-tiny"
    off = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0} if task == "classification" else None
    model = build_model(ModelSource("preset", preset), task, 3, seed=0, config_overrides=off or {"dropout_rate": 0.0})
    g = torch.Generator().manual_seed(1)
    items = []
    for i in range(8):  # different lengths and target lengths: ranks hold unequal token counts
        ids = torch.randint(5, 1000, (3 + 2 * i,), generator=g).tolist()
        target = i % 3 if task == "classification" else torch.randint(5, 1000, (1 + i % 4,), generator=g).tolist()
        items.append((ids, target))
    return model, items


@pytest.mark.slow
@pytest.mark.parametrize("task, accum", [("classification", 1), ("seq2seq", 2)])
def test_ddp_2_ranks_x_bs4_equals_1_process_x_bs8(tmp_path, task, accum):
    out = str(tmp_path / "ddp.json")
    mp.spawn(_window_on_rank, args=(2, _free_port(), task, accum, out), nprocs=2, join=True)
    ddp = json.loads(Path(out).read_text())
    ref = _window(0, 1, task, 1)  # one process, the whole batch, no accumulation: here, with no process group
    assert ddp["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    assert ddp["grads"].keys() == ref["grads"].keys() and ref["grads"]
    for name in ref["grads"]:
        torch.testing.assert_close(
            torch.tensor(ddp["grads"][name]), torch.tensor(ref["grads"][name]), rtol=1e-4, atol=1e-6, msg=name
        )


def _launch_all(study):
    return {spec.row: launch(spec, study.out / "trials" / spec.key(), 300, lambda e: None) for spec in study.specs}


@pytest.mark.slow
def test_gloo_ddp_and_zero2_trials_run_and_combine(tmp_path, cls_csv):
    """A two-process gloo DDP trial and a ZeRO-2 trial run and combine."""
    two = tiny_study(tmp_path / "two", cls_csv, "classification", ["baseline", "zero2"], nproc=2, max_steps=3)
    one = tiny_study(tmp_path / "one", cls_csv, "classification", ["baseline"], max_steps=3)
    r = _launch_all(two) | {"single": _launch_all(one)["baseline"]}
    ddp, zero2, single = r["baseline"], r["zero2"], r["single"]
    assert ddp.status == zero2.status == "ok", (ddp.message, zero2.message)
    assert ddp.world_size == zero2.world_size == 2 and single.world_size == 1
    assert len(ddp.rank_peak_mem_bytes) == 2 and all(p > 0 for p in ddp.rank_peak_mem_bytes)
    assert ddp.peak_mem_bytes == max(ddp.rank_peak_mem_bytes)
    # same global batches: DDP and ZeRO-2 take the same steps, so their losses agree to rounding
    assert zero2.train_loss == pytest.approx(ddp.train_loss, rel=1e-5)
    # against one process only the dropout masks differ
    assert ddp.train_loss == pytest.approx(single.train_loss, rel=0.05)
    # ZeRO-2 keeps half the gradients and half the AdamW state on each of the 2 ranks
    n = single.n_params
    assert single.state_bytes == pytest.approx(16 * n, rel=1e-3)  # + AdamW step counters
    assert zero2.state_bytes == pytest.approx(4 * n + 2 * n + 4 * n, rel=0.01)
    assert ddp.state_bytes == single.state_bytes


@pytest.mark.slow
def test_a_failing_rank_is_a_recorded_row_not_a_hang(tmp_path, cls_csv, monkeypatch):
    monkeypatch.setenv("TRAINWISE_FAULT", "baseline:raise@2")
    study = tiny_study(tmp_path, cls_csv, "classification", ["baseline"], nproc=2, eval_samples=0, trial_timeout=120)
    r = _launch_all(study)["baseline"]
    assert r.status == "error" and "injected fault at step 2" in r.message and r.message.startswith("rank ")
    assert r.wall_s < 100, "torchrun stopped the other rank"


def test_nproc_over_the_cuda_devices_is_rejected_up_front(tmp_path, cls_csv, monkeypatch):
    from trainwise.study import prepare as study_mod

    monkeypatch.setattr(study_mod, "resolve_device", lambda device: ("cuda", {"cuda", "fp16", "bf16"}))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="--nproc 2 needs 2 CUDA devices; this machine has 1"):
        tiny_study(tmp_path / "s", cls_csv, "classification", ["baseline"], nproc=2)
    assert not (tmp_path / "s").exists()


def test_a_zero_row_without_deepspeed_names_the_extra(tmp_path, cls_csv, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs deepspeed \(pip install 'trainwise\[deepspeed\]'\)"):
        tiny_study(tmp_path / "s", cls_csv, "classification", ["zero2"])


def test_zero_rows_configure_deepspeed_and_the_cpu_optimizer():
    def rt(name):
        return strategies.runtime(strategies.parse_row(name, 4).plan, "classification", "cpu")

    zero = {name: rt(name).deepspeed["zero_optimization"] for name in strategies.scale.ZERO}
    assert [z["stage"] for z in zero.values()] == [1, 2, 3, 2, 3]
    assert "offload_optimizer" in zero["zero2_offload"] and "offload_param" not in zero["zero2_offload"]
    assert "offload_param" in zero["zero3_offload"]
    assert all(rt(name).needs_ranks for name in zero) and not rt("baseline").needs_ranks
    assert rt("zero2_offload").optimizer.__name__ == "_cpu_adam" and rt("zero2").grads_sharded


def test_the_report_names_every_ranks_peak_and_the_total():
    from tests.core.test_small_pieces import aggregate_of
    from trainwise.report.format import notes

    combined = combine_ranks([_rank(0, plan={"zero_stage": 2}), _rank(1, plan={"zero_stage": 2})], 2)
    combined.strategy = "zero2"
    lines = notes(aggregate_of(["zero2"], [combined]))
    assert "zero2: 2 ranks, peak mem per rank 1000 B, 1.95 KiB (total 2.93 KiB); DeepSpeed steps inside" in "\n".join(
        lines
    )
    assert any(line.startswith("ranks: time is the slowest rank's") for line in lines)
