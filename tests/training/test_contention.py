"""Contention detected (issue 14, part 2): trials timed while other processes load the CPUs are flagged,
in results and in the table; the arithmetic is checked on made-up samples, the detection on real load."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from trainwise.training.measure.contention import CONTENDED_SHARE, CpuSample, between


def _s(at, busy, steal=0.0, own=0.0):
    return CpuSample(at_s=at, busy_s=busy, steal_s=steal, own_s=own)


@pytest.mark.parametrize(
    "b, share, contended",
    [
        (_s(10, 19.0, own=18.0), 0.05, False),  # 2 CPUs x 10 s: the trial used 18 s, others 1 s
        (_s(10, 19.0, own=8.0), 0.55, True),  # others used 11 s of the 20
        # 22.7% of 2 CPUs slowed a plan search's step 1.57x (BENCHMARKS §D1): flagged, so it is measured again
        (_s(10, 19.0, own=14.46), 0.227, True),
        (_s(10, 10.0, steal=3.0, own=10.0), 0.0, True),  # the hypervisor took 15%
    ],
)
def test_the_share_of_the_cpus_others_used_and_the_flag(b, share, contended):
    r = between(_s(0, 0.0), b, cpus=2)
    assert r["other_cpu_share"] == pytest.approx(share) and r["contended"] is contended


def test_a_window_too_short_for_the_ticks_is_not_judged():
    r = between(_s(0, 0.0), _s(0.02, 0.04, own=0.0), cpus=2)  # 20 ms: 4 ticks, "100% others"
    assert r["other_cpu_share"] == 1.0 and r["contended"] is None


def test_windows_taken_apart_are_judged_as_one():
    """The timed steps and the steps added after the evaluation (autorange): two windows of 0.3 s, each too
    short to judge, are judged together; others' share is over both."""
    first = (_s(0, 0.0), _s(0.3, 0.6, own=0.3))  # others took half of the 2 CPUs
    second = (_s(5, 10.0), _s(5.3, 10.6, own=0.6))  # none
    assert between(*first, cpus=2)["contended"] is None
    r = between(*first, cpus=2, also=(second,))
    assert r["other_cpu_share"] == pytest.approx(0.25) and r["contended"] is not None


def test_a_difference_load_could_explain_is_uncertain():
    """11% of the CPUs taken (a row stored under the old 25% flag; 10% flags it now) can slow a one-thread step by
    12%: a row at 110% is uncertain, one at 150% is not; a row at 90% on a quiet machine is judged as measured. (Rows
    that record no threads: the step's threads on two CPUs, below.)"""
    from trainwise.core.results import StudyRow
    from trainwise.report.format import _time_cell, notes
    from trainwise.study.aggregate import _relative

    base = StudyRow("baseline", status="ok", baseline=True, samples_per_s=100.0, other_cpu_share=0.0)
    rows = {
        speed: _relative(StudyRow(f"r{speed}", status="ok", samples_per_s=speed, other_cpu_share=0.11), base, 0.03, "")
        for speed in (91.0, 66.0)
    }
    assert rows[91.0].uncertain and not rows[66.0].uncertain
    assert _time_cell(rows[91.0]) == "110% (uncertain)" and _time_cell(rows[66.0]) == "152%"
    quiet = _relative(StudyRow("q", status="ok", samples_per_s=111.0, other_cpu_share=0.0), base, 0.03, "")
    assert not quiet.uncertain and quiet.within_noise is False
    said = notes([base, *rows.values()])
    assert any(line.startswith("uncertain:") and "r91.0 11%" in line for line in said)
    assert not any("r66.0" in line for line in said if line.startswith("uncertain:"))


def test_on_two_cores_the_step_waits_for_the_loaded_one():
    """seed 004's grad_accum @w2 (BENCHMARKS §K1): 21% of 2 CPUs taken by others, 129% of the baseline while the
    same row at 0 workers read 85%. Its threads wait for the loaded core at every operator: uncertain, not a
    verdict (one thread on shared CPUs, s / (1 - s), would have allowed 26%)."""
    from trainwise.core.results import StudyRow
    from trainwise.study.aggregate import _relative, load_bound

    two = {"device": "cpu", "cpu_count": 2, "torch_threads": 2}
    base = StudyRow("baseline", status="ok", baseline=True, samples_per_s=3.7, other_cpu_share=0.016, env=two)
    row = StudyRow("grad_accum @w2", status="ok", samples_per_s=2.87, other_cpu_share=0.207, env=two)
    assert load_bound(row) == pytest.approx(0.414 / 0.586, rel=1e-3)
    judged = _relative(row, base, 0.104, "")
    assert judged.uncertain and judged.rel_time == pytest.approx(1.289, rel=1e-3)
    assert not _relative(dataclasses.replace(row, other_cpu_share=0.02), base, 0.104, "").uncertain
    # a one-thread trial on the same 2 CPUs, and a GPU trial, wait on one core only: the share alone
    one = dataclasses.replace(row, env={**two, "torch_threads": 1})
    gpu = dataclasses.replace(row, env={**two, "device": "cuda"})
    assert load_bound(one) == load_bound(gpu) == pytest.approx(0.207 / 0.793, rel=1e-3)


def test_no_proc_stat_no_figure():
    empty = {"other_cpu_share": None, "steal_share": None, "contended": None, "cpu_mhz": None}
    assert between(None, _s(1, 1.0)) == empty


def test_the_cpu_clock_at_the_start_and_the_end_is_kept():
    """A clock that fell between the start and the end of the timed steps (throttling) is on record."""
    from dataclasses import replace

    from trainwise.training.measure.contention import cpu_mhz, sample

    r = between(replace(_s(0, 0.0), mhz=3000.0), replace(_s(10, 10.0, own=10.0), mhz=2100.0), cpus=2)
    assert r["cpu_mhz"] == [3000.0, 2100.0]
    from trainwise.core.results import StudyRow
    from trainwise.report.format import notes

    row = StudyRow("baseline", status="ok", baseline=True, cpu_mhz=[3000.0, 2100.0])
    assert any("clock fell" in line and "3000 -> 2100 MHz" in line for line in notes([row]))
    assert not any("clock fell" in line for line in notes([replace(row, cpu_mhz=[2300.0, 2300.0])]))
    if cpu_mhz() is not None:  # Linux reports it (cpufreq or /proc/cpuinfo)
        here = sample()
        assert here is not None and here.mhz is not None and 100 < here.mhz < 10_000


def test_a_busy_process_beside_the_measured_one_is_seen():
    """Measured in a child while a sibling spins: the child sees another process take about a core."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        code = (
            "import json, time; from trainwise.training.measure.contention import sample, between; "
            "a = sample(); time.sleep(1.5); print(json.dumps(between(a, sample())))"
        )
        seen = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    finally:
        busy.kill()
    assert seen["other_cpu_share"] > CONTENDED_SHARE and seen["contended"] is True, seen


# a trial timed under real load, flagged in results, the table and its notes: tests/training/test_device.py
# (test_a_trial_contended_by_a_busy_process_is_measured_again, whose first run is loaded)


def test_a_failed_added_step_leaves_the_studys_steps_standing(monkeypatch, autorange):
    """An added step that fails (an OOM on a longer batch) must not fail a trial whose own steps all ran: the
    added ones are dropped, the counts restored, the load judged on the study's window alone."""
    from types import SimpleNamespace

    from trainwise.training import trial
    from trainwise.training.measure.timing import StepTimer, StepTimes

    timer = StepTimer(lambda: None)
    timer.steps += [StepTimes(compute_s=0.05) for _ in range(4)]  # 1 warm-up and 3 timed steps of 50 ms
    counts = {"samples": 24, "real": 100, "padded": 200}

    def oom(parts, _stream, _until, on_step, _phases):
        on_step(1.0, [SimpleNamespace(n_samples=8, real_tokens=30, padded_tokens=64)])  # one added step ran
        raise RuntimeError("CUDA out of memory (injected)")

    monkeypatch.setattr(trial.loop, "run", oom)
    ran = []
    monkeypatch.setattr(trial.contention, "sample", lambda: ran.append(1))  # the added window was begun
    assert trial._autorange(SimpleNamespace(world=1, step=4), None, timer, counts, 1) == ()
    assert ran and len(timer.steps) == 4 and counts == {"samples": 24, "real": 100, "padded": 200}
