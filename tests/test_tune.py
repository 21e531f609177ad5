"""trainwise tune: the search space file, Optuna random/TPE studies that resume, the compute curve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from trainwise.cli import main
from trainwise.errors import ConfigError
from trainwise.tune import _summarise, load_space


def _space(tmp_path, text):
    f = tmp_path / "space.yaml"
    f.write_text(text)
    return str(f)


def test_a_space_file_parses(tmp_path):
    space = load_space(
        _space(
            tmp_path,
            "lr: {low: 1.0e-5, high: 1.0e-3, log: true}\nbatch_size: {choices: [8, 16]}\n"
            "warmup_ratio: {low: 0, high: 0.2}\n",
        )
    )
    assert [(p.name, p.log, p.choices) for p in space] == [
        ("lr", True, None),
        ("batch_size", False, (8, 16)),
        ("warmup_ratio", False, None),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("dropout: {low: 0, high: 0.5}\n", "unknown parameter 'dropout'; known: lr, batch_size"),
        ("lr: {low: 1.0e-3, high: 1.0e-3}\n", "empty range"),
        ("lr: {low: -1.0e-3, high: 1.0e-3, log: true}\n", "a log-scale range must be > 0"),
        ("lr: {low: 0, high: 1.0e-3, log: true}\n", "a log-scale range must be > 0"),
        ("batch_size: {choices: []}\n", "choices must be a non-empty list"),
        ("lr: [1, 2]\n", "needs {low, high"),
        ("lr: {low: a, high: b}\n", "needs numeric low and high"),
        ("{{{\n", "not YAML"),
        ("", "expected a mapping"),
    ],
)
def test_bad_space_files(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_space(_space(tmp_path, text))


def test_tune_cli_bad_input_is_one_line(tmp_path, capsys):
    space = _space(tmp_path, "lr: {low: 1.0e-5, high: 1.0e-3, log: true}\n")
    for args, message in (
        (["--search", "pbt"], "pbt (Ray Tune population-based training) is not built yet"),
        (["--search", "grid"], "--search must be one of random, tpe, pbt"),
        (["--trials", "0"], "--trials must be > 0"),
        (["--space", str(tmp_path / "none.yaml")], "not found"),
    ):
        argv = ["tune", "--space", space, "--out", str(tmp_path / "t"), *args]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "t").exists()


def test_the_best_so_far_curve_counts_the_compute_of_every_trial():
    import optuna

    study = optuna.create_study(direction="maximize")
    for value, state, steps in (
        (50.0, "COMPLETE", 10),
        (None, "PRUNED", 4),
        (70.0, "COMPLETE", 10),
        (60.0, "COMPLETE", 10),
    ):
        study.add_trial(
            optuna.trial.create_trial(
                params={"lr": 1e-4},
                distributions={"lr": optuna.distributions.FloatDistribution(1e-5, 1e-3, log=True)},
                value=value,
                state=getattr(optuna.trial.TrialState, state),
                user_attrs={"steps": steps},
            )
        )
    r = _summarise(study)
    assert r.curve == [(10, 50.0), (14, 50.0), (24, 70.0), (34, 70.0)]
    assert r.best_value == 70.0 and [t["state"] for t in r.trials] == ["complete", "pruned", "complete", "complete"]


@pytest.mark.slow
def test_an_interrupted_optuna_study_continues_where_it_stopped(tmp_path, cls_csv):
    space = _space(tmp_path, "lr: {low: 1.0e-4, high: 3.0e-3, log: true}\nweight_decay: {low: 0.0, high: 0.1}\n")
    out = tmp_path / "study"
    argv = [sys.executable, "-m", "trainwise.cli", "tune", "--space", space, "--search", "tpe", "--trials", "4"]
    argv += ["--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--max-length", "32", "--batch-size", "8"]
    argv += ["--max-steps", "4", "--eval-every", "2", "--eval-samples", "16", "--device", "cpu", "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen(
        argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, start_new_session=True
    )
    assert first.stderr is not None
    for line in first.stderr:
        if line.startswith("  trial 1:"):  # two trials finished: stop the study the hard way
            os.killpg(first.pid, signal.SIGKILL)
            break
    first.wait()
    assert first.returncode == -9
    second = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0, second.stderr
    result = json.loads((out / "tune_result.json").read_text())
    finished = [t["number"] for t in result["trials"]]
    assert len(finished) == 4 and finished[:2] == [0, 1], "the first two trials were kept, not re-run"
    assert "  trial 0:" not in second.stderr and "  trial 1:" not in second.stderr
    assert result["best_value"] is not None and result["curve"][-1][0] == sum(t["steps"] for t in result["trials"])
