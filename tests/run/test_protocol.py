"""The one child protocol: typed events on the wire, and `launcher.run(job)` bringing back one typed result
for every kind of job (a compare trial, a training run, a tune trial) through every backend here (a fork of
the zygote, a fresh process, torchrun's ranks, this process)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tests.child import EchoJob
from tests.conftest import tiny_study
from trainwise.core.results import TrainResult, TrialResult, TuneTrialResult
from trainwise.run import launcher
from trainwise.run.events import (
    PIPE_BUF,
    Checkpoint,
    Eval,
    Note,
    Phase,
    Projection,
    Reader,
    Result,
    Step,
    Warn,
    event_of,
    lines,
)
from trainwise.training import job as trial_job
from trainwise.training.measure.contention import MIN_WINDOW_S

ROOT = Path(__file__).resolve().parents[2]
TRAIN = TrainResult(
    8, 10, True, 0.5, 4, 0.75, "metric", [{"step": 4, "train_loss": 0.6}], None, 3.0, "/o", {"total": 1}
)
EVENTS = [
    Phase("data"),
    Step(3, 10, 0.25, step_s=0.5),
    Step(3, 10, 0.25, lr=1e-3),
    Eval(4, {"train_loss": 0.5, "accuracy": 0.75, "best": True}),
    Checkpoint(4, "/o/checkpoints/ckpt-00000004"),
    Note("measuring again"),
    Warn("checkpoint damaged"),
    Projection(12.5, "about a minute"),
    Projection(3.0),
    Result(TrialResult("baseline", "ok", step_time_s=0.1, metrics={"accuracy": 0.5}), rank=1),
    Result(TRAIN),
    Result(TuneTrialResult("complete", 0.75, 60)),
]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the child imports tests.child's job


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_round_trips_the_wire_typed(event):
    wire = json.loads(json.dumps(event.to_dict()))
    assert event_of(wire) == event
    assert Reader().read(wire) == event
    assert Reader().read({"event": "where", "pid": 1}) is None, "a stray JSON line is no event"


def test_a_result_over_a_pipe_write_comes_back_whole():
    """A result longer than a pipe writes at once comes back whole among others."""
    big = [Result(TrialResult("baseline", "ok", env={"pad": str(r) * 9000}), rank=r) for r in (0, 1)]
    parts = [lines(e) for e in big]
    assert all(len(p) > 1 and all(len(line) <= PIPE_BUF for line in p) for p in parts)
    reader, back = Reader(), []
    for a, b in zip(*parts, strict=False):  # two ranks' parts, interleaved line by line
        back += [reader.read(json.loads(a)), reader.read(json.loads(b))]
    assert [e for e in back if e is not None] == big


@pytest.mark.parametrize("backend", ["fork", "exec", "here"])
def test_a_job_comes_back_as_its_typed_result_from_each_backend(tmp_path, backend):
    seen: list = []
    r = launcher.run(EchoJob(str(tmp_path)), seen.append, backend=backend)
    assert isinstance(r, TrialResult) and (r.status, r.step_time_s, r.world_size) == ("ok", 1.0, 1)
    assert seen == [Step(s, 3, 1.0 / s, step_s=0.5) for s in (1, 2, 3)]


@pytest.mark.parametrize("backend", ["fork", "exec"])
def test_each_rank_sends_its_result_and_the_parent_combines(tmp_path, backend):
    """Torchrun's ranks each send their result and the parent combines them."""
    seen: list = []
    r = launcher.run(EchoJob(str(tmp_path), ranks=2, big=True), seen.append, backend=backend, timeout_s=300)
    assert (r.status, r.world_size, r.step_time_s) == ("ok", 2, 2.0), (tmp_path / "log").read_text()
    assert r.rank_peak_mem_bytes == [1000, 2000] and r.env["pad"] == "x" * 6000
    assert [e.step for e in seen] == [1, 2, 3], "one progress stream: rank 0's"


@pytest.mark.parametrize("backend", ["fork", "exec"])
def test_a_compare_trial_returns_its_row_leaving_no_file(tmp_path, cls_csv, backend, autorange):
    spec = tiny_study(tmp_path / "s", cls_csv, "classification", ["baseline"], max_steps=2).specs[0]
    trial_dir = tmp_path / "trial"
    seen: list = []
    r = launcher.run(trial_job.TrialJob(spec, trial_dir), seen.append, backend=backend, timeout_s=300)
    assert r.status == "ok", r.message
    assert r.strategy == "baseline" and r.wall_s is not None and r.timed_steps > 0
    assert [e.phase for e in seen if isinstance(e, Phase)] == ["data", "model", "train", "eval", "measure"]
    # 2 steps of a tiny model are too short a window to see the machine's load: steps are added until it is
    # long enough, and the load judged; the loss and the progress are the study's 2 steps. (On a machine slow
    # enough that 2 steps already fill the window none are added: it failed so once, beside another pytest.)
    assert r.timed_s >= MIN_WINDOW_S and r.contended is not None
    assert r.added_steps > 0 or r.timed_s >= 1.2 * MIN_WINDOW_S, r
    assert [e.step for e in seen if isinstance(e, Step)] == [1, 2]
    assert not list(trial_dir.glob("result*.json"))


def test_a_killed_trial_is_a_crashed_row_naming_the_signal(tmp_path, cls_csv, monkeypatch):
    """A killed compare trial is a crashed row naming the signal."""
    monkeypatch.setenv("TRAINWISE_FAULT", "baseline:kill@1")
    spec = tiny_study(tmp_path / "s", cls_csv, "classification", ["baseline"], max_steps=2).specs[0]
    r = trial_job.launch(spec, tmp_path / "trial", 300, lambda e: None)
    assert r.status == "crashed" and r.message.startswith("trial process killed by SIGKILL (")


def test_a_tune_trial_and_a_training_run_come_back_typed(tmp_path, cls_csv):
    """A tune trial in a forked process; a training run in this process and as a group of one rank."""
    from trainwise.core.config import TrainConfig
    from trainwise.search.hyperparams import TuneTrial
    from trainwise.training.fit import TrainJob

    spec = tiny_study(tmp_path / "s", cls_csv, "classification", ["baseline"], eval_samples=16).specs[0]
    tc = TrainConfig(epochs=10, max_steps=4, eval_every=2, save_every=4, monitor="eval_loss", checkpoints=False)
    events: list = []
    trial = launcher.run(TuneTrial(spec, tc, tmp_path / "trial"), events.append, timeout_s=300)
    assert trial.state == "complete" and trial.steps == 4 and trial.value is not None and math.isfinite(trial.value)
    evals = [e for e in events if isinstance(e, Eval)]
    assert [e.step for e in evals] == [2, 4] and trial.value == min(e.values["eval_loss"] for e in evals)
    # and every step, typed, for the parent's progress line (nothing else: warnings stay in the trial's log)
    assert [(type(e), e.step) for e in events if not isinstance(e, Eval)] == [(Step, s) for s in (1, 2, 3, 4)]

    here = launcher.run(TrainJob(spec, tc, tmp_path / "here"), backend="here")
    ranked = launcher.run(TrainJob(spec, tc, tmp_path / "ranked"), timeout_s=300)
    assert isinstance(ranked, TrainResult) and ranked.steps == here.steps == 4
    assert ranked.final_loss == pytest.approx(here.final_loss, abs=1e-5)
    saved = json.loads((tmp_path / "ranked" / "train_result.json").read_text())
    assert saved == {**dataclasses.asdict(ranked), "compute_saved": ranked.compute_saved}
