"""Contention detected (issue 14, part 2): trials timed while other processes load the CPUs are flagged,
in results and in the table; the arithmetic is checked on made-up samples, the detection on real load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainwise.measure.contention import CONTENDED_SHARE, CpuSample, between


def _s(at, busy, steal=0.0, own=0.0):
    return CpuSample(at_s=at, busy_s=busy, steal_s=steal, own_s=own)


@pytest.mark.parametrize(
    "b, share, contended",
    [
        (_s(10, 19.0, own=18.0), 0.05, False),  # 2 CPUs x 10 s: the trial used 18 s, others 1 s
        (_s(10, 19.0, own=8.0), 0.55, True),  # others used 11 s of the 20
        (_s(10, 10.0, steal=3.0, own=10.0), 0.0, True),  # the hypervisor took 15%
    ],
)
def test_the_share_of_the_cpus_others_used_and_the_flag(b, share, contended):
    r = between(_s(0, 0.0), b, cpus=2)
    assert r["other_cpu_share"] == pytest.approx(share) and r["contended"] is contended


def test_a_window_too_short_for_the_ticks_is_not_judged():
    r = between(_s(0, 0.0), _s(0.02, 0.04, own=0.0), cpus=2)  # 20 ms: 4 ticks, "100% others"
    assert r["other_cpu_share"] == 1.0 and r["contended"] is None


def test_no_proc_stat_no_figure():
    empty = {"other_cpu_share": None, "steal_share": None, "contended": None, "cpu_mhz": None}
    assert between(None, _s(1, 1.0)) == empty


def test_the_cpu_clock_at_the_start_and_the_end_is_kept():
    """A clock that fell between the start and the end of the timed steps (throttling) is on record."""
    from dataclasses import replace

    from trainwise.measure.contention import cpu_mhz, sample

    r = between(replace(_s(0, 0.0), mhz=3000.0), replace(_s(10, 10.0, own=10.0), mhz=2100.0), cpus=2)
    assert r["cpu_mhz"] == [3000.0, 2100.0]
    from trainwise.report.format import notes
    from trainwise.results import StudyRow

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
            "import json, time; from trainwise.measure.contention import sample, between; "
            "a = sample(); time.sleep(1.5); print(json.dumps(between(a, sample())))"
        )
        seen = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    finally:
        busy.kill()
    assert seen["other_cpu_share"] > CONTENDED_SHARE and seen["contended"] is True, seen


# a trial timed under real load, flagged in results, the table and its notes: tests/test_device.py
# (test_a_trial_contended_by_a_busy_process_is_measured_again, whose first run is loaded)
