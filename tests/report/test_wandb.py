"""Issue 38, part 4: Weights & Biases beside TensorBoard and MLflow, offline (WANDB_MODE=offline: no network, no
login). compare logs one run per trial, grouped by the study, and the table as a W&B Table; train logs its curves.
What was logged is read back from the offline run files (tests/wandb_log.py), the records `wandb sync` uploads."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import here, wandb_log
from trainwise.study.store import read_results

pytest.importorskip("wandb", reason="trainwise[wandb] is in requirements.lock: make venv installs it")


@pytest.fixture
def offline(tmp_path) -> Iterator[dict[str, str]]:
    """W&B offline, its own files in the test's folder (no login, nothing written to HOME). A test that logs in
    this process starts W&B's service: it is shut down when the test ends, not left to the interpreter's exit (where
    its atexit hook met a service already gone: "Exception ignored in atexit callback ... ConnectionResetError"
    after the suite's summary, issue 60)."""
    yield {
        "WANDB_MODE": "offline",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }
    import wandb

    wandb.teardown()


def _compare(cls_csv: Path, out: Path, rows: str) -> list[str]:
    argv = ["compare", "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--strategies", rows]
    argv += ["--batch-size", "8", "--max-length", "32", "--max-steps", "3", "--warmup-steps", "1"]
    return [
        *argv,
        "--eval-samples",
        "0",
        "--no-remeasure",
        "--device",
        "cpu",
        "--report-to",
        "wandb",
        "--out",
        str(out),
    ]


@pytest.mark.slow
def test_compare_logs_one_run_per_trial_in_a_study_group(tmp_path, cls_csv, offline):
    """Compare logs a run per trial, grouped by the study, and the table."""
    out = tmp_path / "study"
    done = here.trainwise(*_compare(cls_csv, out, "baseline,dynamic_pad"), env=offline)
    assert done.returncode == 0, done.stderr
    assert "wandb:" not in done.stderr, "a trial's run is logged silently"
    runs = wandb_log.runs(out)
    trials, tables = [r for r in runs if r.job_type == "trial"], [r for r in runs if r.job_type == "study"]
    assert [r.name for r in trials] == ["baseline #0 bs8", "dynamic_pad #0 bs8"] and len(tables) == 1
    assert {r.group for r in runs} == {"study"}
    stored = {r.strategy: r for r in read_results(out)}
    for run in trials:
        row = stored[run.config["row"]]
        assert run.config["batch_size"] == 8 and run.config["model_ref"] == "bert-tiny"
        assert [run.history[s]["train/loss"] for s in sorted(run.history)] == pytest.approx(row.losses)
        assert sorted(run.history) == [1, 2, 3]
        assert run.summary["status"] == "ok" and run.summary["step_time_s"] == pytest.approx(row.step_time_s)
        assert run.summary["peak_mem_bytes"] == row.peak_mem_bytes and run.exit_code == 0
    [table] = [json.loads(f.read_text()) for f in out.glob("wandb/offline-run-*/files/media/table/*.table.json")]
    assert table["columns"][0] == "strategy" and [r[0] for r in table["data"]] == ["baseline", "dynamic_pad"]

    # a row added: its trial is logged, the stored ones are not logged again
    again = here.trainwise(*_compare(cls_csv, out, "baseline,dynamic_pad,grad_accum"), env=offline)
    assert again.returncode == 0, again.stderr
    names = [r.name for r in wandb_log.runs(out) if r.job_type == "trial"]
    assert names == ["baseline #0 bs8", "dynamic_pad #0 bs8", "grad_accum #0 bs8"]


@pytest.mark.slow
def test_train_logs_its_curves_and_result(tmp_path, cls_csv, offline):
    out = tmp_path / "run"
    argv = ["train", "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--batch-size", "8"]
    argv += ["--max-length", "32", "--max-steps", "4", "--eval-every", "2", "--eval-samples", "16", "--device", "cpu"]
    done = here.trainwise(*argv, "--report-to", "wandb", "--out", str(out), env=offline)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^  step 4/4  loss \d+\.\d{4}  \d+\.\d samples/s$", done.stderr, re.M), done.stderr  # piped
    [run] = wandb_log.runs(out)
    assert run.job_type == "train" and (out / "wandb_run_id").read_text() == run.id
    assert sorted(s for s, v in run.history.items() if "train/loss" in v) == [1, 2, 3, 4]
    assert all("train/lr" in run.history[s] for s in (1, 2, 3, 4))
    assert "eval/accuracy" in run.history[2] and "eval/accuracy" in run.history[4]
    result = json.loads((out / "train_result.json").read_text())
    assert run.summary["steps"] == result["steps"] == 4 and run.exit_code == 0
    assert run.config["plan"] == "baseline" and run.config["max_steps"] == 4


def test_a_resumed_training_run_continues_its_wandb_run(tmp_path, offline, monkeypatch):
    from trainwise.run.events import Step
    from trainwise.training.tracking import Tracker

    for k, v in offline.items():
        monkeypatch.setenv(k, v)
    first = Tracker(("wandb",), tmp_path, "run", {"lr": 0.1}, resume=False)
    for step in (1, 2, 3):
        first.log(Step(step, 5, 1.0 / step, lr=0.1))
    first.close(failed=True)  # killed: the next session resumes it
    second = Tracker(("wandb",), tmp_path, "run", {"lr": 0.1}, resume=True)
    for step in (4, 5):
        second.log(Step(step, 5, 1.0 / step, lr=0.1))
    second.close({"steps": 5})
    a, b = wandb_log.runs(tmp_path)
    assert a.id == b.id == (tmp_path / "wandb_run_id").read_text()
    assert sorted(a.history) == [1, 2, 3] and sorted(b.history) == [4, 5] and b.summary["steps"] == 5
    assert (a.exit_code, b.exit_code) == (1, 0)
    fresh = Tracker(("wandb",), tmp_path, "run", {"lr": 0.1}, resume=False)  # the same --out, not --resume
    fresh.log(Step(1, 2, 1.0, lr=0.1))
    fresh.close({"steps": 1})
    assert wandb_log.runs(tmp_path)[-1].id != a.id and (tmp_path / "wandb_run_id").read_text() != a.id
    unused = Tracker(("wandb",), tmp_path / "checked", "run", {}, resume=False)  # stopped before its first step
    unused.close(failed=True)
    assert not (tmp_path / "checked" / "wandb").exists(), "no W&B run for a run that never stepped"


def test_a_wandb_failure_is_a_warning_and_the_run_goes_on(tmp_path, offline, monkeypatch):
    from trainwise.run.events import Step
    from trainwise.training import tracking

    def down(*a, **k):
        raise TimeoutError("the W&B server did not answer")

    monkeypatch.setattr(tracking, "_wandb_init", down)
    said: list[str] = []
    tracker = tracking.Tracker(("wandb",), tmp_path, "run", {}, warn=said.append)
    for step in (1, 2, 3):
        tracker.log(Step(step, 3, 1.0))
    tracker.close({"steps": 3})
    assert said == ["--report-to wandb: TimeoutError: the W&B server did not answer; the run goes on without W&B"]


@pytest.mark.slow
def test_compare_says_a_wandb_failure_once_and_stores_all(tmp_path, cls_csv, offline, monkeypatch):
    """A compare whose wandb fails says it once and stores every trial."""
    from trainwise.training import tracking

    calls = []

    def down(*a, **k):
        calls.append(a)
        raise TimeoutError("the W&B server did not answer")

    monkeypatch.setattr(tracking, "_wandb_init", down)
    out = tmp_path / "study"
    done = here.trainwise(*_compare(cls_csv, out, "baseline,dynamic_pad"), env=offline)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("--report-to wandb: TimeoutError") == 1 and len(calls) == 1, "said once, tried once"
    assert [r.status for r in read_results(out)] == ["ok", "ok"]


@pytest.mark.parametrize(
    "verb, report_to, env, says",
    [
        ("compare", "tensorboard", {"WANDB_MODE": "offline"}, "compare --report-to takes wandb"),
        ("compare", "wandb", {"WANDB_MODE": ""}, "--report-to wandb: no W&B login here: run `wandb login`"),
        ("train", "wandb", {"WANDB_MODE": ""}, "--report-to wandb: no W&B login here: run `wandb login`"),
        ("train", "wandb,comet", {"WANDB_MODE": "offline"}, "--report-to: unknown 'comet'"),
    ],
)
def test_report_to_bad_input_is_one_line_and_exit_2(tmp_path, cls_csv, verb, report_to, env, says, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    env = {**env, "NETRC": str(tmp_path / "no-netrc")}
    argv = [verb, "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--out", str(tmp_path / "out")]
    done = here.trainwise(*argv, "--report-to", report_to, env=env)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out" / "wandb").exists()
