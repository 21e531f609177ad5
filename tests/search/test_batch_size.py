"""find-batch: the search's decisions on scripted trials, and OOM recovery with real trial processes."""

from __future__ import annotations

import html
import json
from types import SimpleNamespace

import pytest

from trainwise.core.results import TrialResult
from trainwise.search.batch_size import search

GiB = 2**30


def fake_runner(oom_from: int, speed: dict[int, float], rss: dict[int, int] | None = None, iqr: float | None = None):
    """`iqr`: each size's step-to-step interquartile range, relative to its step (over 3 timed steps)."""
    calls: list[int] = []

    def run(b: int) -> TrialResult:
        calls.append(b)
        if b >= oom_from:
            return TrialResult("baseline", "oom", 0, "CUDA out of memory")
        return TrialResult(
            "baseline",
            "ok",
            0,
            samples_per_s=speed.get(b, 1.0),
            step_time_s=b / speed.get(b, 1.0),
            peak_rss_bytes=(rss or {}).get(b, GiB),
            peak_mem_bytes=GiB // 4,
            peak_reserved_bytes=(rss or {}).get(b, GiB),
            step_time_iqr_s=None if iqr is None else iqr * b / speed.get(b, 1.0),
            timed_steps=1 if iqr is None else 3,
        )

    return run, calls


def test_fastest_is_not_the_largest_and_the_edge_is_bisected():
    speed = {4: 10.0, 8: 18.0, 16: 30.0, 24: 26.0, 28: 25.0}
    run, calls = fake_runner(oom_from=32, speed=speed)
    r = search([4, 8, 16, 32, 64], 100 * GiB, run, "cpu", refine=2, multiple_of=4)
    statuses = {p.batch_size: p.status for p in r.points}
    assert statuses == {4: "ok", 8: "ok", 16: "ok", 24: "ok", 28: "ok", 32: "oom", 64: "skipped"}
    assert 64 not in calls, "nothing larger than a size that did not fit is run"
    assert r.largest_fit == 28 and r.fastest == 16


def test_sizes_within_the_noise_tie_and_the_noise_is_shown():
    """Issue 27: 8.8 vs 8.8 samples/s was called 'fastest: batch 16'. Sizes within the noise of the fastest
    (compare's one-repeat noise floor, from each size's timed steps) are a tie, named, with the noise."""
    run, _ = fake_runner(oom_from=10**9, speed={4: 6.0, 8: 8.8, 16: 8.8})
    r = search([4, 8, 16], 100 * GiB, run, "cpu", refine=0)  # one timed step each: no noise figure
    assert r.tied == [8, 16] and r.mark(8) == r.mark(16) == " (tie)" and r.mark(4) == ""
    assert r.verdict().startswith("fastest: a tie within the noise between batches 8, 16 (8.8, 8.8 samples/s;")
    assert "noise not measured: 1 timed step per size" in r.verdict()

    run, _ = fake_runner(oom_from=10**9, speed={4: 6.0, 8: 9.6, 16: 10.0}, iqr=0.05)  # noise ±7.6%
    r = search([4, 8, 16], 100 * GiB, run, "cpu", refine=0)
    assert r.points[-1].noise == pytest.approx(0.0758, abs=1e-3)
    assert r.tied == [16, 8] and "between batches 8, 16 (9.6, 10.0 samples/s; noise ±7.6%" in r.verdict()

    run, _ = fake_runner(oom_from=10**9, speed={4: 6.0, 8: 8.0, 16: 10.0}, iqr=0.05)
    r = search([4, 8, 16], 100 * GiB, run, "cpu", refine=0)
    assert r.tied == [16] and r.mark(16) == " (fastest)"
    assert r.verdict() == (
        "fastest: batch 16 (10.0 samples/s, 25.0% ahead of batch 8; noise ±7.6% (from each size's 3+ timed "
        "steps, as compare's noise floor)); largest that fits: 16"
    )


def test_sizes_the_estimate_rules_out_are_never_run():
    run, calls = fake_runner(oom_from=10**9, speed={4: 1.0, 8: 2.0, 16: 3.0})
    r = search(
        [4, 8, 16, 32],
        8 * GiB,
        run,
        "cpu",
        estimate=lambda b: SimpleNamespace(total_bytes=b * GiB // 2, peak_bytes=b * GiB // 3),
        refine=0,
    )
    assert calls == [4, 8, 16]
    assert [p.status for p in r.points] == ["ok", "ok", "ok", "skipped"]
    assert "estimate" in r.points[-1].note and r.fastest == 16


def test_cpu_fit_is_judged_by_the_memory_limit():
    run, _ = fake_runner(oom_from=10**9, speed={4: 1.0, 8: 2.0, 16: 3.0}, rss={4: GiB, 8: 2 * GiB, 16: 5 * GiB})
    r = search([4, 8, 16], 4 * GiB, run, "cpu", refine=0)
    assert [p.status for p in r.points] == ["ok", "ok", "over_limit"]
    assert r.largest_fit == 8 and r.fastest == 8


def test_cuda_fit_counts_reserved_memory_plus_the_context():
    run, _ = fake_runner(oom_from=10**9, speed={4: 1.0}, rss={4: 3 * GiB})
    r = search([4], 3 * GiB + 100, run, "cuda", refine=0)
    assert r.points[0].status == "over_limit"  # 3 GiB reserved + 0.5 GiB context > limit


@pytest.mark.slow
def test_find_batch_recovers_from_an_out_of_memory_trial(tmp_path, cls_csv, monkeypatch, capsys):
    """A trial process that runs out of memory at batch 16 is a recorded point; the search finishes."""
    from trainwise.cli import main

    monkeypatch.setenv("TRAINWISE_FAULT", "bs=16:oom@1")
    out = tmp_path / "fb"
    code = main(
        [
            "find-batch",
            "--model-preset",
            "bert-tiny",
            "--train-file",
            str(cls_csv),
            "--max-length",
            "32",
            "--candidates",
            "4,8,16,32",
            "--steps",
            "2",
            "--no-estimate",
            "--refine",
            "1",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "find_batch.json").read_text())
    statuses = {p["batch_size"]: p["status"] for p in result["points"]}
    assert statuses == {4: "ok", 8: "ok", 12: "ok", 16: "oom", 32: "skipped"}
    assert result["largest_fit"] == 12 and result["fastest"] in (4, 8, 12)
    assert (out / "find_batch.png").stat().st_size > 1000
    verdict = next(line.strip() for line in capsys.readouterr().out.splitlines() if "fastest: " in line)
    page = (out / "report.html").read_text()  # its page: the verdict (a batch, or a tie), every size and the curve
    assert '<figure id="find-batch">' in page and "<td>oom</td>" in page and html.escape(verdict) in page


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--candidates", "8,x"], "--candidates '8,x'"),
        (["--candidates", "0,8"], "positive batch sizes"),
        (["--strategies", "bf16,grad_ckpt"], "one plan"),
        (["--steps", "1"], "--steps must be >= 2"),
        (["--memory-limit", "big"], "--memory-limit 'big'"),
        (["--strategies", "grad_accum", "--candidates", "6,10"], "multiple of --accum-steps"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, expected):
    from trainwise.cli import main

    out = tmp_path / "fb"
    assert main(["find-batch", "--model-preset", "bert-tiny", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
    assert not out.exists()
