"""Truth on any machine: precision verdicts from the device's facts (injected: a test cannot need a V100),
confirmed by a measured linear layer; a probe sized to the device; MFU never above 100%; one statistic
per row; trials timed under load measured again."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest

from tests.conftest import tiny_study
from trainwise import strategies
from trainwise.core.device import DeviceFacts
from trainwise.core.results import TrialResult, combine_ranks, utilisation
from trainwise.training.measure import device as dev
from trainwise.training.measure import flops
from trainwise.training.measure.timing import StepTimes, summarize_steps

AVX2 = DeviceFacts("cpu", "AMD EPYC", frozenset({"avx2"}))
SAPPHIRE = DeviceFacts("cpu", "Intel Xeon", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}))


def gpu(cap: tuple[int, int]) -> DeviceFacts:
    return DeviceFacts("cuda", f"GPU {cap}", frozenset(), cap)


def verdict(row: str, facts: DeviceFacts) -> tuple[str, str] | None:
    found = strategies.worst(strategies.support(strategies.parse_row(row, 4).plan, facts))
    return None if found is None else (found[0], found[1].status)


@pytest.mark.parametrize(
    "facts, expected",
    [
        (AVX2, {"bf16": "emulated", "bf16_pure": "emulated", "fp16": "unsupported", "tf32": "unsupported"}),
        (SAPPHIRE, {"bf16": "native", "bf16_pure": "native", "fp16": "unsupported", "tf32": "unsupported"}),
        (gpu((6, 1)), {"bf16": "emulated", "fp16": "emulated", "tf32": "inert"}),  # GTX 10xx
        (gpu((7, 0)), {"bf16": "emulated", "fp16": "native", "tf32": "inert"}),  # V100
        (gpu((7, 5)), {"bf16": "emulated", "fp16": "native", "tf32": "inert"}),  # T4, seed 004's machine
        (gpu((8, 0)), {"bf16": "native", "fp16": "native", "tf32": "native"}),  # A100
        (gpu((9, 0)), {"bf16": "native", "fp16": "native", "tf32": "native"}),  # H100
    ],
)
def test_each_precision_has_a_verdict_from_the_devices_facts(facts, expected):
    for row, status in expected.items():
        assert verdict(row, facts)[1] == status, (row, facts)
    assert verdict("baseline", facts) is None and verdict("grad_ckpt", facts) is None  # fp32: no verdict
    assert verdict("bf16+grad_ckpt", facts) == verdict("bf16", facts)  # a row is judged by its precision


def test_the_reason_names_the_missing_unit_and_where_it_is_a_win():
    _, found = strategies.worst(strategies.support(strategies.parse_row("bf16", 4).plan, AVX2))
    line = found.line()
    assert line.startswith("bf16 emulated on this CPU") and "no avx512_bf16 / amx_bf16" in line and "Ampere" in line
    _, v100 = strategies.worst(strategies.support(strategies.parse_row("tf32", 4).plan, gpu((7, 0))))
    assert "compute capability 7.0" in v100.reason and "does nothing" in v100.reason


def test_injected_cpu_flags_replace_what_the_machine_reports(monkeypatch):
    monkeypatch.setenv("TRAINWISE_CPU_FLAGS", "avx2 fma")
    facts = dev.facts("cpu")
    assert facts.cpu_flags == {"avx2", "fma"} and facts.injected
    monkeypatch.delenv("TRAINWISE_CPU_FLAGS")
    assert not dev.facts("cpu").injected and dev.facts("cpu").cpu_flags <= set(dev.PRECISION_FLAGS)
    assert dev.cuda_capability((9, 0)) == (9, 0)
    monkeypatch.setenv("TRAINWISE_CUDA_CAPABILITY", "7.5")
    assert dev.cuda_capability((9, 0)) == (7, 5), "an H100 asked what a T4 would say"


@pytest.mark.parametrize(
    "facts, ratio, status",
    [(SAPPHIRE, 26.0, "emulated"), (AVX2, 0.5, "native"), (AVX2, 26.0, "emulated"), (SAPPHIRE, 1.4, "native")],
)
def test_the_measured_linear_layer_wins_where_the_flags_disagree(monkeypatch, facts, ratio, status):
    from trainwise.study import prepare as study

    monkeypatch.setattr(study, "precision_ratio", lambda device, precision: ratio)
    found = study.precision_verdicts([strategies.parse_row("bf16", 4)], "cpu", facts)["bf16"]
    assert found.status == status and found.ratio == ratio


def _fake_launch(calls: list):
    def launch(spec, trial_dir, timeout, emit):
        calls.append(spec)
        return TrialResult(spec.row, "ok", spec.repeat, plan=spec.plan.to_dict(), samples_per_s=10.0)

    return launch


def test_an_emulating_cpu_records_bf16_and_trains_the_rest(tmp_path, cls_csv, monkeypatch):
    """The demo on an AVX2-only CPU: bf16 is recorded from its micro-benchmark, not trained for minutes;
    `all` trains with fp32; a row the user names is trained, with the reason attached."""
    from trainwise.report.format import cells, footnotes, notes
    from trainwise.study import prepare as study
    from trainwise.study.aggregate import aggregate
    from trainwise.study.run import run_study

    monkeypatch.setenv("TRAINWISE_CPU_FLAGS", "avx2 fma")
    monkeypatch.setattr(study, "precision_ratio", lambda device, precision: 26.0)
    defaults = strategies.DEFAULT_STRATEGIES.split(",")
    prepared = tiny_study(tmp_path / "d", cls_csv, "classification", defaults, device="auto")
    calls: list = []
    trials = run_study(prepared, _fake_launch(calls), lambda *_: None, lambda *_: None)
    launched = {spec.row: spec for spec in calls}
    assert "bf16" not in launched and "fp16" not in launched
    assert launched["all"].plan.value("precision") == "fp32" and launched["all"].plan.value("grad_ckpt")
    by_row = {spec.row: r for spec, r in trials}
    assert by_row["bf16"].status == "emulated" and "not trained" in by_row["bf16"].message
    assert "26.0x slower" in by_row["bf16"].message and "no avx512_bf16" in by_row["bf16"].message
    assert by_row["all"].support_note.startswith("trained with fp32 instead of bf16")
    table = aggregate(prepared.cells, trials)
    bf16 = next(e for e in table if e.strategy == "bf16")
    assert cells(bf16, footnotes(table)["bf16"])[7] == "~2600% (linear)"
    assert any(line.startswith("all: trained with fp32") for line in notes(table))

    # named now, in the same --out: the recorded bf16 is trained (the stored 'emulated' is not a result)
    named = tiny_study(tmp_path / "d", cls_csv, "classification", ["baseline", "bf16", "all"])
    calls.clear()
    trials = run_study(named, _fake_launch(calls), lambda *_: None, lambda *_: None)
    assert [s.row for s in calls] == ["bf16", "all"], "the baseline is stored; bf16 and bf16's all are new"
    assert calls[1].plan.value("precision") == "bf16", "a row the user names is trained as asked"
    bf16_row = next(r for spec, r in trials if spec.row == "bf16")
    assert bf16_row.status == "ok" and "emulated on this CPU" in bf16_row.support_note


def test_all_never_switches_to_the_precision_that_measured_slow(tmp_path, cls_csv, monkeypatch):
    """Flags that say native (this CPU's, or an Ampere GPU's) but a linear layer 26x slower: `all` does not
    'switch' to bf16 again; it trains fp32 here (fp16 is CUDA-only)."""
    from trainwise.study import prepare as study

    monkeypatch.setenv("TRAINWISE_CPU_FLAGS", "avx2 avx512_bf16 amx_bf16")
    monkeypatch.setattr(study, "precision_ratio", lambda device, precision: 26.0)
    defaults = strategies.DEFAULT_STRATEGIES.split(",")
    prepared = tiny_study(tmp_path, cls_csv, "classification", defaults, device="auto")
    assert prepared.row_notes["all"].startswith("trained with fp32 instead of bf16: bf16 emulated on this CPU")
    assert "yet measured as slow as emulation" in prepared.recorded["bf16"].reason


def test_a_verdict_names_what_it_judges():
    _, v100 = strategies.worst(strategies.support(strategies.parse_row("fp16+tf32", 4).plan, gpu((7, 0))))
    assert v100.line().startswith("tf32 inert on this GPU"), "fp16 is native there: tf32 is the one judged"


def test_all_takes_fp16_where_bf16_is_emulated_and_fp16_native():
    row = strategies.parse_row("all", 4)
    fp16 = strategies.with_precision(row, "fp16")
    assert fp16.text == "all" and fp16.plan.value("precision") == "fp16"
    assert verdict("bf16+grad_ckpt", gpu((7, 0)))[1] == "emulated"
    assert strategies.support(fp16.plan, gpu((7, 0)))["precision"].status == "native"
    assert strategies.with_precision(row, None).plan.value("precision") == "fp32"


# ---- the peak probe ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mixed, weights, mode",
    [
        ("no", None, "fp32"),
        ("bf16", None, "autocast-bf16"),
        ("fp16", None, "autocast-fp16"),
        ("no", "bfloat16", "weights-bf16"),
    ],
)
def test_the_peak_is_probed_on_the_operation_the_plan_runs(mixed, weights, mode):
    assert flops.linear_mode(mixed, weights) == mode


def test_the_probe_fits_a_slow_path_within_its_budget(monkeypatch):
    """A path as slow as emulated bf16 on an AVX2 CPU (0.29 GFLOP/s: a 2048^2 matmul took 59 s): the probe
    stays on a small layer and within its budget instead of timing minutes."""
    sizes = []

    def slow_runner(device, n, mode):
        sizes.append(n)
        return lambda: time.sleep(2 * n**3 / 0.29e9)

    monkeypatch.setattr(dev, "_linear_runner", slow_runner)
    t0 = time.perf_counter()
    best, n = dev.best_linear("cpu", "weights-bf16", budget_s=0.5)
    spent = time.perf_counter() - t0
    assert n == 256 and sizes == [128, 256], "128 (14 ms) is under 20 ms: one doubling, then it stops (116 ms)"
    assert 0.1e9 < best < 0.35e9
    assert spent < 1.5, f"{spent:.2f} s: the probe ran far past its budget"


def test_the_probe_grows_until_a_run_takes_tens_of_milliseconds(monkeypatch):
    seen = []

    def fast_runner(device, n, mode):
        seen.append(n)
        return lambda: time.sleep(2 * n**3 / 50e9)  # 50 GFLOP/s: 128^3 takes 0.08 ms

    monkeypatch.setattr(dev, "_linear_runner", fast_runner)
    _, n = dev.best_linear("cpu", "fp32", budget_s=0.3)
    assert n >= 512 and seen == sorted(seen)


def test_the_peak_is_cached_per_device_and_mode(tmp_path, monkeypatch):
    from trainwise.training.measure import contention

    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    quiet = {"other_cpu_share": 0.0, "steal_share": 0.0, "contended": False}
    monkeypatch.setattr(contention, "between", lambda *_a, **_k: quiet)
    first = flops.matmul_peak("cpu", "fp32", budget_s=0.05)
    assert 1e8 < first < 1e14, "a CPU does between 0.1 GFLOP/s and 100 TFLOP/s"
    monkeypatch.setattr(dev, "best_linear", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("again")))
    assert flops.matmul_peak("cpu", "fp32") == first
    with pytest.raises(AssertionError, match="again"):
        flops.matmul_peak("cpu", "autocast-bf16")  # another mode: measured on its own


def test_a_probe_taken_under_load_is_not_cached(tmp_path, monkeypatch):
    from trainwise.training.measure import contention

    monkeypatch.setenv("TRAINWISE_CACHE", str(tmp_path))
    loaded = {"other_cpu_share": 0.5, "steal_share": 0.0, "contended": True}
    monkeypatch.setattr(contention, "between", lambda *_a, **_k: loaded)
    assert flops.matmul_peak("cpu", "fp32", budget_s=0.05) > 0
    assert not list((tmp_path / "peak").glob("*.json"))
    # a window too short to judge (contended None) with the CPUs taken is loaded too (issue 36)
    loaded |= {"other_cpu_share": 0.69, "contended": None}
    assert flops.matmul_peak("cpu", "fp32", budget_s=0.05) > 0
    assert not list((tmp_path / "peak").glob("*.json"))
    loaded |= {"other_cpu_share": 0.02, "contended": None}  # short and quiet: kept
    assert flops.matmul_peak("cpu", "fp32", budget_s=0.05) > 0
    assert len(list((tmp_path / "peak").glob("*.json"))) == 1


def test_mfu_above_100_percent_is_never_printed():
    """1348% once: the peak had been timed on a kernel the model did not run. Such a row says so instead."""
    assert utilisation(2e9, 1.0, 10e9) == (0.2, "")
    mfu, note = utilisation(13.48e9, 1.0, 1e9)
    assert mfu is None and "peak probe is wrong" in note
    assert utilisation(None, 1.0, 1e9) == (None, "")


# ---- one statistic per row ---------------------------------------------------------------------------------


def _row(name: str, steps: list[float], batch: int, n_train: int = 1000) -> TrialResult:
    s = summarize_steps([StepTimes(compute_s=t) for t in steps], batch * len(steps), 100 * len(steps))
    return TrialResult(
        name,
        "ok",
        step_time_s=s["step_time_s"],
        samples_per_s=s["samples_per_s"],
        tokens_per_s=s["tokens_per_s"],
        epoch_time_s=n_train / s["samples_per_s"],
        timed_s=s["timed_s"],
        timed_steps=len(steps),
        step_time_iqr_s=s["step_time_iqr_s"],
        padding_waste=0.0,
    )


def test_a_slow_step_moves_no_column_from_the_others():
    """A step 10x slower among quiet ones: step (s), samples/s, epoch and time % still agree exactly
    (all from the totals: a median step beside a total-over-total rate read 2.689 s/step, 6.4 samples/s)."""
    from trainwise.spec.config import Cell
    from trainwise.strategies import parse_row
    from trainwise.study.aggregate import aggregate

    base = _row("baseline", [1.0, 1.0, 10.0, 1.0, 1.0], batch=32)
    other = _row("grad_ckpt", [1.3, 1.3, 1.3, 1.3, 1.3], batch=32)
    assert base.step_time_s == pytest.approx(2.8) and base.samples_per_s * base.step_time_s == pytest.approx(32)
    assert base.epoch_time_s == pytest.approx(1000 / 32 * 2.8)

    class Spec:
        def __init__(self, row):
            self.row, self.repeat = row, 0
            self.settings = type("S", (), {"batch_size": 32, "num_workers": 0, "model_kind": "dir", "task": "x"})

    cells = [Cell(parse_row("baseline", 4), 32, 0), Cell(parse_row("grad_ckpt", 4), 32, 0)]
    b, g = aggregate(cells, [(Spec("baseline"), base), (Spec("grad_ckpt"), other)])
    per_sample = (g.step_time_s / 32) / (b.step_time_s / 32)
    assert g.rel_time == pytest.approx(per_sample) == pytest.approx(g.epoch_time_s / b.epoch_time_s)
    assert g.rel_time == pytest.approx(1.3 / 2.8)


def test_ranks_combine_at_the_slowest_ranks_step():
    a = _row("zero2", [1.0, 1.0, 5.0], batch=8)
    b = _row("zero2", [1.2, 1.2, 1.2], batch=8)
    for r in (a, b):
        r.world_size, r.peak_mem_bytes, r.flops_per_step, r.peak_flops_per_s = 2, 1, 1e9, 10e9
    row = combine_ranks([a, b], 2)
    assert row.step_time_s == pytest.approx(7 / 3) and row.samples_per_s == pytest.approx(16 / (7 / 3))
    assert row.epoch_time_s == pytest.approx(1000 / row.samples_per_s)
    assert row.mfu == pytest.approx(1e9 / (7 / 3) / 10e9), "MFU at the step the row reports"


# ---- contention: measured again once quiet -----------------------------------------------------------------


def _busy(n: int = 2) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def test_the_noise_floor_and_verdicts_use_clean_runs_only():
    from trainwise.spec.config import Cell
    from trainwise.study.aggregate import aggregate

    class Spec:
        def __init__(self, row, repeat):
            self.row, self.repeat = row, repeat
            self.settings = type("S", (), {"batch_size": 32, "num_workers": 0, "model_kind": "dir", "task": "x"})

    base_clean = _row("baseline", [1.0, 1.02, 0.98, 1.0], batch=32)
    base_loaded = _row("baseline", [8.19] * 4, batch=32)
    base_loaded.contended, base_loaded.repeat = True, 1
    loaded = _row("adafactor", [1.3] * 4, batch=32)
    loaded.contended = True
    cells = [Cell(strategies.parse_row(r, 4), 32, 0) for r in ("baseline", "adafactor")]
    trials = [(Spec("baseline", 0), base_clean), (Spec("adafactor", 0), loaded), (Spec("baseline", 1), base_loaded)]
    base, row = aggregate(cells, trials)
    assert base.step_time_s == 1.0, "the clean run gives the row's timing"
    assert base.noise_floor < 0.1, "the loaded run (8.19 s) is not in the floor"
    assert row.within_noise is None, "a row timed under load gets no verdict"


def test_a_failed_re_run_keeps_the_run_measured_under_load(tmp_path, cls_csv, monkeypatch):
    from trainwise.study.run import run_study
    from trainwise.training.measure import contention

    monkeypatch.setattr(contention, "wait_quiet", lambda *_a, **_k: True)
    prepared = tiny_study(tmp_path, cls_csv, "classification", ["baseline"], retries=2)
    runs = [
        TrialResult("baseline", "ok", step_time_s=1.6, samples_per_s=5.0, contended=True, other_cpu_share=0.5),
        TrialResult("baseline", "timeout", message="killed"),
    ]
    events: list = []
    [(_, r)] = run_study(prepared, lambda *_: runs.pop(0), lambda spec, e: events.append(e), lambda *_: None)
    assert r.status == "ok" and r.contended and r.samples_per_s == 5.0 and r.discarded_runs == 1
    assert "measured under load (1.600 s/step, 50% of the CPUs" in events[0].text
    assert "the re-run ended timeout" in events[-1].text


def test_a_re_run_measured_while_still_busy_stays_flagged(tmp_path, cls_csv, monkeypatch):
    """Issue 36: re-runs taken while the machine was 'still busy after 120 s: measuring anyway' were accepted as
    clean when their timed window was too short to judge (contended None)."""
    from trainwise.study.run import run_study
    from trainwise.training.measure import contention

    monkeypatch.setattr(contention, "wait_quiet", lambda *_a, **_k: False)
    prepared = tiny_study(tmp_path, cls_csv, "classification", ["baseline"], retries=1)
    runs = [
        TrialResult("baseline", "ok", step_time_s=1.6, samples_per_s=5.0, contended=True, other_cpu_share=0.5),
        TrialResult("baseline", "ok", step_time_s=0.9, samples_per_s=9.0, contended=None),
    ]
    events: list = []
    [(_, r)] = run_study(prepared, lambda *_: runs.pop(0), lambda spec, e: events.append(e), lambda *_: None)
    assert r.samples_per_s == 9.0 and r.contended is True and r.discarded_runs == 1
    assert any("known to be busy" in getattr(e, "text", "") for e in events)


def test_wait_quiet_returns_once_a_busy_process_stops():
    """The waiting process's own children count as its own work (a trial's workers): the busy processes
    here are started detached (re-parented by a shell that exits), as another user's job would be."""
    import os
    import signal

    from trainwise.training.measure import contention

    if not contention.wait_quiet(20.0, window_s=1.0):
        pytest.skip("the machine is busy with other work: quiet cannot be told from busy here")
    spin = f"{sys.executable} -c 'while True: pass'"
    detached = f"{spin} >/dev/null 2>&1 & echo $!"
    out = subprocess.run(["sh", "-c", f"{detached}; {detached}"], capture_output=True, text=True)
    pids = [int(x) for x in out.stdout.split()]
    try:
        time.sleep(0.3)
        assert contention.wait_quiet(2.0, window_s=1.0) is False, "busy: not quiet within 2 s"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    assert contention.wait_quiet(10.0, window_s=1.0) is True


@pytest.mark.slow
def test_a_trial_contended_by_a_busy_process_is_measured_again(tmp_path, cls_csv, autorange):
    """A real busy process during the first run of the trial, stopped after it: the first run is flagged as
    timed under load (in results, the table and its notes), the study waits for quiet, runs it again, keeps the
    clean run and counts the discarded one."""
    from trainwise.report.format import cells, notes
    from trainwise.run import zygote
    from trainwise.run.events import Note
    from trainwise.study.aggregate import aggregate
    from trainwise.study.run import run_study
    from trainwise.training.job import launch
    from trainwise.training.measure.contention import CONTENDED_SHARE

    # 4 steps: the loaded run's window (~1 s a step with two spinning processes on 2 cores) is long enough to
    # judge, and the clean run's is lengthened to one by the trial's autorange
    study = tiny_study(tmp_path, cls_csv, "classification", ["baseline"], eval_samples=0, max_steps=4, retries=2)
    # a machine busy for reasons of its own: the 3-run branch below, sooner
    study.config = dataclasses.replace(study.config, quiet_wait_s=10.0)
    runs, events = [], []
    zygote.warm()  # the trials fork from a zygote that imported before the load starts, not under it
    zygote.settle()

    def first_run_loaded(spec, trial_dir, timeout, emit):
        busy = _busy() if not runs else []
        try:
            result = launch(spec, trial_dir, timeout, emit)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        runs.append(result)
        return result

    trials = run_study(study, first_run_loaded, lambda spec, e: events.append(e), lambda *_: None)
    [(spec, r)] = trials
    loaded = runs[0]
    assert loaded.status == "ok" and loaded.contended is True and loaded.other_cpu_share > CONTENDED_SHARE, loaded
    # the run timed under load, had it stayed the row (--retries 0): flagged in the table and its notes
    [flagged] = aggregate(study.cells, [(spec, loaded)])
    assert flagged.contended is True and cells(flagged)[7].endswith("(loaded)")
    assert any(line.startswith("measured under load — timings unreliable") for line in notes([flagged]))
    if runs[-1].contended:  # the machine stayed busy for reasons of its own: up to --retries runs, flagged
        assert len(runs) == 3 and r.contended
        return
    assert r.status == "ok" and r.contended is False and r.discarded_runs == len(runs) - 1 >= 1
    assert any(isinstance(e, Note) and "measuring again (1 of --retries 2)" in e.text for e in events)
    [row] = aggregate(study.cells, trials)
    assert any(line.startswith("re-measured:") and f"baseline {r.discarded_runs}" in line for line in notes([row]))
    assert row.step_time_s == r.step_time_s and row.discarded_runs == r.discarded_runs


# ---- trainwise doctor --------------------------------------------------------------------------------------


# What doctor's trials exercise, one row each: a forked trial (baseline), an emulated precision (bf16), the image
# task (channels_last), the causal-LM task (packing) and torchrun ranks (zero2). Every other row's trial runs the
# same launcher on the same presets; all of them run for real in `make bench` (the `bench` case below).
DOCTOR_SEAMS = frozenset({"baseline", "bf16", "channels_last", "packing", "zero2"})


def _trials_only_for(rows: frozenset[str], run_study):
    """doctor's run_study, launching a real trial only for `rows`; another row stands on its task's baseline's
    result under its own name (doctor's verdict, table and doctor.json still cover it)."""
    import dataclasses

    def some(prepared, launch, on_event, on_done):
        ran: dict = {}

        def launch_some(spec, *where_and_how):
            if spec.row in rows or "baseline" not in ran:  # each task's baseline comes first
                ran[spec.row] = launch(spec, *where_and_how)
                return ran[spec.row]
            return dataclasses.replace(ran["baseline"], strategy=spec.row, plan=spec.plan.to_dict())

        return run_study(prepared, launch_some, on_event, on_done)

    return some


@pytest.mark.parametrize(
    "real",
    [
        pytest.param(DOCTOR_SEAMS, marks=pytest.mark.slow, id="a-trial-per-seam"),
        pytest.param(None, marks=pytest.mark.bench, id="every-trial"),
    ],
)
def test_doctor_gives_every_strategy_a_verdict_on_this_cpu(tmp_path, monkeypatch, capsys, real):
    """The whole doctor through the CLI, on CPU, with an AVX2-only CPU's flags injected and its measured
    bf16 slowness (a test cannot need that CPU): every strategy has a verdict, bf16 trains and reads
    emulated with the reason, the CUDA-only ones are unsupported with why, and doctor.json holds the facts.
    CI trains one row per seam (DOCTOR_SEAMS); `make bench` trains every row (two minutes on 2 cores)."""
    import json

    from trainwise.cli import main
    from trainwise.study import prepare as study
    from trainwise.study import run
    from trainwise.study.device_checks import VERDICTS

    if real is not None:  # the doctor's driver (trainwise.api.doctor) takes run_study from its module when it runs
        monkeypatch.setattr(run, "run_study", _trials_only_for(real, run.run_study))
    monkeypatch.setenv("TRAINWISE_CPU_FLAGS", "avx2 fma")
    monkeypatch.setattr(study, "precision_ratio", lambda device, precision: 26.0)
    code = main(["doctor", "--device", "cpu", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((tmp_path / "doctor.json").read_text())
    checks = {(c["strategy"], c["task"]): c for c in report["checks"]}
    assert {s for s, _ in checks} == set(strategies.REGISTRY), "every registry strategy has a verdict"
    assert {c["verdict"] for c in checks.values()} <= set(VERDICTS)
    for name, st in strategies.REGISTRY.items():
        if "cuda" in st.requires:
            found = next(c for (s, _), c in checks.items() if s == name)
            assert found["verdict"] == "unsupported" and "needs cuda" in found["detail"], found
    bf16 = checks[("bf16", "classification")]
    assert bf16["verdict"] == "emulated" and "no avx512_bf16 / amx_bf16" in bf16["detail"]
    assert bf16["step_time_s"] > 0, "an emulated precision is still trained by the doctor"
    assert checks[("baseline", "classification")]["verdict"] == "ok"
    assert checks[("channels_last", "image-classification")]["verdict"] == "ok"
    assert checks[("packing", "causal-lm")]["verdict"] == checks[("zero2", "classification")]["verdict"] == "ok"
    assert report["device"]["injected"] and report["device"]["cpu_flags"] == ["avx2", "fma"]
    assert report["peaks_flops_per_s"]["fp32"] > 1e8 and set(report["precision_ratios"]) == {"bf16", "bf16_pure"}
    assert report["environment"]["torch_version"] and "trainwise doctor" in printed


def test_a_tf32_row_is_probed_and_labelled_apart_from_fp32(monkeypatch):
    """On an H200 the tf32 row's probe read 403 TFLOP/s against fp32's 51: both were labelled `fp32` in the MFU
    note (2026-11-26). The label is the probe's cache key: fp32 with TF32 matmuls on a GPU is `fp32-tf32`."""
    from trainwise.training.measure import flops

    monkeypatch.setattr(flops, "_tf32_on", lambda: True)
    assert flops.probe_mode("cuda", "fp32") == "fp32-tf32"
    assert flops.probe_mode("cuda", "autocast-fp16") == "autocast-fp16"
    assert flops.probe_mode("cpu", "fp32") == "fp32"
    monkeypatch.setattr(flops, "_tf32_on", lambda: False)
    assert flops.probe_mode("cuda", "fp32") == "fp32"
