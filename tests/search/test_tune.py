"""trainwise tune: the search space file, Optuna random/TPE studies that resume, the compute curve."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests import here
from tests.killing import alive_after
from trainwise.cli import main
from trainwise.core.errors import ConfigError
from trainwise.search.hyperparams import _summarise, load_space, make_sampler
from trainwise.search.pbt import summarise as summarise_pbt


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
    # YAML 1.1 reads 1e-5 (no dot) as a string, and a quoted "32" is one too: both are numbers here
    [lr, batch] = load_space(_space(tmp_path, 'lr: {low: 1e-5, high: 1e-3}\nbatch_size: {choices: [16, "32"]}\n'))
    assert (lr.low, lr.high, batch.choices) == (1e-5, 1e-3, (16, 32))


@pytest.mark.parametrize(
    "text, message",
    [
        ("dropout: {low: 0, high: 0.5}\n", "unknown parameter 'dropout'; known: lr, batch_size"),
        ("lr: {low: 1.0e-3, high: 1.0e-3}\n", "empty range"),
        ("lr: {low: -1.0e-3, high: 1.0e-3, log: true}\n", r"lr: -0.001 is out of range \(must be > 0\)"),
        ("weight_decay: {low: 0, high: 1.0e-3, log: true}\n", "a log-scale range must be > 0"),
        ("batch_size: {choices: []}\n", "choices must be a non-empty list"),
        ("lr: [1, 2]\n", "needs {low, high"),
        ("lr: {low: a, high: b}\n", "lr: .a. is not a number"),
        ("lr: {high: 1.0e-3}\n", "lr needs numeric low and high"),
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
        (["--cpus-per-trial", "2"], "--cpus-per-trial is for --search pbt"),
        (["--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: cannot connect"),  # random/tpe's trials too
        (["--search", "pbt", "--max-steps", "30", "--eval-every", "20"], "--max-steps must be >= 2 x 20"),
        (["--search", "pbt", "--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: cannot connect"),
        (["--search", "pbt", "--ray-address", "nowhere"], "expected HOST:PORT"),
        (["--search", "pbt", "--cpus-per-trial", "0"], "--cpus-per-trial must be > 0"),
        (["--search", "pbt", "--trials", "1"], "needs a population (--trials) of at least 2"),
        (["--search", "grid"], "--search must be one of random, tpe, pbt"),
        (["--trials", "0"], "--trials must be > 0"),
        (["--space", str(tmp_path / "none.yaml")], "not found"),
    ):
        argv = ["tune", "--space", space, "--out", str(tmp_path / "t"), *args]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "t").exists()


def test_a_search_of_equal_scores_says_it_ranked_nothing():
    """seed 000's recipe: ROUGE-L 0.0 for every trial of a random-init BART after 40 steps."""
    from trainwise.search.hyperparams import tie_note

    def trial(v, state="complete"):
        return {"value": v, "state": state}

    said = tie_note([trial(0.0), trial(0.0), trial(None, "fail")], "random")
    assert said and "every trial scored the same (0)" in said and "--monitor eval_loss" in said
    assert "every member" in (tie_note([trial(1.5), trial(1.5)], "pbt") or "")
    assert tie_note([trial(0.0), trial(0.01)], "random") is None and tie_note([trial(0.0)], "random") is None
    already = tie_note([trial(6.9), trial(6.9)], "random", "eval_loss") or ""
    assert "--monitor eval_loss" not in already and "train longer" in already


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


def test_tune_ends_with_the_train_command_of_its_best_trial(tmp_path, cls_study, cls_csv, capsys, monkeypatch):
    """Issue 27: tune ended without a way to train its answer. The `trainwise train` command of the best
    trial's settings (its values on the tune's model, data and plan, for its steps) is printed and kept in
    tune_result.json; tuned values train has no option for are named."""
    import shlex

    tw = importlib.import_module("trainwise.search.hyperparams")  # trainwise.search.hyperparams: the API's call
    from trainwise.report import terminal
    from trainwise.study.origin import DataOrigin

    spec = next(s for s in cls_study.specs if s.row == "baseline")
    cfg = tw.TuneConfig(_space(tmp_path, "lr: {low: 1.0e-5, high: 1.0e-3}\n"), trials=2, max_steps=40, eval_every=20)
    best = {"lr": 3e-4, "batch_size": 16, "weight_decay": 0.01}
    trial = {"number": 0, "state": "complete", "value": 0.5, "params": best, "steps": 40}
    monkeypatch.setattr(tw, "run_tune", lambda *a, **k: tw.TuneResult(0.5, best, [trial], []))  # as if searched
    out = tmp_path / "tune"
    out.mkdir()
    from trainwise.exporting.commands import best_train_command  # (what the verb hands the search)

    origin = DataOrigin(train_file=str(cls_csv))
    result, report = tw._search(cfg, spec, out, None, lambda line: None, origin, command_of=best_train_command)
    assert json.loads((out / "tune_result.json").read_text())["train_command"] == report["train_command"]
    argv = shlex.split(report["train_command"])
    given = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert argv[:2] == ["trainwise", "train"] and given["--strategies"] == "baseline"
    assert (given["--model-preset"], given["--train-file"]) == ("bert-tiny", str(cls_csv))
    assert (given["--lr"], given["--batch-size"], given["--max-steps"]) == ("0.0003", "16", "40")
    assert int(given["--epochs"]) * (spec.settings.n_train // 16) >= 40, "enough passes for the trial's steps"
    assert given["--out"] == str(tmp_path / "train-tune-best")
    assert report["train_command_note"] == "train has no option for weight_decay=0.01: this command trains " + (
        "weight_decay=0.0 (the defaults)"
    )
    terminal.tune_table(result, report, "tpe", "metric", str(out))
    printed = " ".join(capsys.readouterr().out.split())
    assert f"train the best trial's settings: {report['train_command']}" in printed
    assert main([*argv[1:], "--patience", "0"]) == 2  # every option parses; stopped at a check of its own
    assert "--patience must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_an_interrupted_optuna_study_continues_where_it_stopped(tmp_path, cls_csv):
    space = _space(tmp_path, "lr: {low: 1.0e-4, high: 3.0e-3, log: true}\nweight_decay: {low: 0.0, high: 0.1}\n")
    out = tmp_path / "study"
    argv = [sys.executable, "-m", "trainwise.cli", "tune", "--space", space, "--search", "tpe", "--trials", "4"]
    argv += ["--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--max-length", "32", "--batch-size", "8"]
    argv += ["--max-steps", "4", "--eval-every", "2", "--eval-samples", "16", "--device", "cpu", "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # trial 2 hangs at its second step, so the kill lands while it is in flight (a 4-step trial of bert-tiny can
    # end within a second of the previous one: a sleep could miss it)
    first = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**env, "TRAINWISE_FAULT": "tune#2:hang@2"},
        start_new_session=True,
    )
    assert first.stderr is not None
    for line in first.stderr:
        if line.startswith("  trial 1:"):  # two trials finished: stop the study the hard way, in trial 2
            time.sleep(1.0)
            os.killpg(first.pid, signal.SIGKILL)
            break
    first.wait()
    assert first.returncode == -9
    second = here.trainwise(*argv[3:])  # resumed in this process: its trials fork from the session's zygote
    assert second.returncode == 0, second.stderr
    result = json.loads((out / "tune_result.json").read_text())
    finished = [t["number"] for t in result["trials"]]
    assert len(finished) == 4 and finished[:2] == [0, 1], "the first two trials were kept, not re-run"
    killed = result["trials"][2]
    assert killed["state"] == "fail" and killed["error"] == "interrupted: its tune run was killed", killed
    assert "  trial 0:" not in second.stderr and "  trial 1:" not in second.stderr
    assert result["best_value"] is not None and result["curve"][-1][0] == sum(t["steps"] for t in result["trials"])


def test_pbt_needs_something_to_mutate_and_says_how_to_get_ray(tmp_path, capsys, monkeypatch):
    batch_only = _space(tmp_path, "batch_size: {choices: [8, 16]}\n")
    argv = ["tune", "--space", batch_only, "--search", "pbt", "--out", str(tmp_path / "t")]
    assert main(argv) == 2
    assert "mutates lr, weight_decay, label_smoothing" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    argv[2] = _space(tmp_path, "lr: {low: 1.0e-5, high: 1.0e-3, log: true}\n")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--search pbt needs Ray Tune: pip install 'trainwise[ray]'" in err[0]
    assert not (tmp_path / "t").exists()


def test_pbt_summary_counts_all_steps_and_dates_each_mutation():
    def report(member, step, ran, at, value, lr):
        return {"member": member, "step": step, "ran": ran, "at": at, "objective": value, "config": {"lr": lr}}

    reports = [
        report(0, 10, 10, 1.0, 50.0, 1e-3),
        report(1, 10, 10, 1.1, 40.0, 1e-2),
        report(0, 20, 10, 2.0, 60.0, 1e-3),
        report(1, 20, 10, 2.2, 65.0, 1.2e-3),  # member 1 continued from member 0's step-10 checkpoint
        report(1, 30, 10, 3.1, float("nan"), 1.2e-3),  # an evaluation that failed to produce a number
        report(0, 30, 10, 3.0, 62.0, 1e-3),
    ]
    mutations = [{"member": 1, "from": 0, "old": {"lr": 1e-3}, "new": {"lr": 1.2e-3}}]
    mutations.append({"member": 0, "from": 1, "old": {"lr": 1.2e-3}, "new": {"lr": 1.44e-3}})  # at the end
    r = summarise_pbt(reports, mutations, "metric", errors=((1, "boom"), (None, "no report")))
    assert r.curve == [(10, 50.0), (20, 50.0), (30, 60.0), (40, 65.0), (50, 65.0)]
    assert r.best_value == 65.0 and r.best_params == {"lr": 1.2e-3}
    assert [m["step"] for m in r.mutations] == [10, None]
    rows = {t["number"]: t for t in r.trials}
    assert rows[0]["steps"] == rows[1]["steps"] == 30 and rows[0]["value"] == 62.0
    assert rows[1]["state"] == "fail" and rows[1]["error"] == "boom" and rows[-1]["steps"] == 0
    loss = summarise_pbt(reports[:2], [], "train_loss")
    assert loss.best_value == 40.0 and loss.curve == [(10, 50.0), (20, 40.0)]
    assert all("node" not in t for t in r.trials), "on one machine no trial names a node"
    # on a cluster each report says where the member trained that interval: a member's row, where it trained last
    placed = [{**x, "node": f"10.0.0.{i}"} for i, x in enumerate(reports)]
    nodes = {t["number"]: t["node"] for t in summarise_pbt(placed, [], "metric").trials}
    assert nodes == {0: "10.0.0.5", 1: "10.0.0.4"}


@pytest.mark.slow
def test_a_tune_trial_past_its_timeout_is_killed_and_recorded(tmp_path, cls_csv):
    """Like compare's: the trial (and all it started) is killed; a search whose every trial failed exits 1."""
    space = _space(tmp_path, "lr: {low: 1.0e-4, high: 3.0e-3, log: true}\n")
    out = tmp_path / "study"
    argv = ["tune", "--space", space, "--search", "random", "--trials", "1", "--model-preset", "bert-tiny"]
    argv += ["--train-file", str(cls_csv), "--max-length", "32", "--batch-size", "8", "--max-steps", "4"]
    argv += ["--eval-every", "2", "--device", "cpu", "--out", str(out), "--trial-timeout", "0.5"]
    run = here.trainwise(*argv, env={"TRAINWISE_FAULT": "tune#0:hang@2"})  # a forked trial ends 4 steps in 0.5 s
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "trainwise: error: no trial of 1 produced a value; the first: no result within --trial-timeout 0.5s; killed"
    )
    [trial] = json.loads((out / "tune_result.json").read_text())["trials"]
    assert trial["state"] == "fail"
    # the trial was forked by this session's zygote (or exec'd as trainwise.run.worker where it cannot fork): gone
    from trainwise.run import zygote

    def command(p: psutil.Process) -> str:
        with contextlib.suppress(psutil.Error):  # a zombie an earlier test left unreaped has no command line
            return " ".join(p.cmdline())
        return ""

    forked = psutil.Process(zygote._zygote.proc.pid).children() if zygote._zygote is not None else []
    execd = [p for p in psutil.Process().children(recursive=True) if "trainwise.run.worker" in command(p)]
    assert alive_after(forked + execd) == [], "the timed-out trial was killed"


def test_pbt_members_train_under_out_or_a_nodes_temp(tmp_path):
    """Where PBT's members keep their checkpoints: under --out with a local Ray (the default), in this
    user's folder of the node's temporary directory on a cluster (its nodes may not see --out)."""
    from trainwise.search.pbt import member_scratch

    assert member_scratch(tmp_path, None) == tmp_path / "pbt-members"
    assert member_scratch(tmp_path, "127.0.0.1:6379").name == f"trainwise-pbt-{os.getuid()}"


def test_decoding_params_are_seq2seq_and_reach_generation(tmp_path, capsys, monkeypatch, s2s_study):
    import dataclasses

    import transformers

    from trainwise.training.trial import run_trial

    space = _space(tmp_path, "num_beams: {choices: [1, 4]}\nlength_penalty: {low: 0.6, high: 1.4}\n")
    names = [p.name for p in load_space(space)]
    assert names == ["num_beams", "length_penalty"]
    assert main(["tune", "--space", space, "--task", "classification", "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "num_beams, length_penalty: decoding parameters apply to --task seq2seq only" in err
    zero = _space(tmp_path, "num_beams: {choices: [0, 2]}\n")
    assert main(["tune", "--space", zero, "--task", "seq2seq", "--out", str(tmp_path / "t")]) == 2
    assert "num_beams: 0 is out of range (must be >= 1" in capsys.readouterr().err
    seen = []
    real = transformers.GenerationMixin.generate

    def spy(self, *args, **kwargs):
        seen.append((kwargs["num_beams"], kwargs["length_penalty"]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", spy)
    spec = next(s for s in s2s_study.specs if s.row == "baseline")
    beams = dataclasses.replace(spec.settings, num_beams=3, length_penalty=0.7)
    r = run_trial(dataclasses.replace(spec, settings=beams))
    assert r.status == "ok" and seen and set(seen) == {(3, 0.7)}


def test_tpe_models_the_space_after_a_quarter_of_a_small_budget():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def picks(search):
        study = optuna.create_study(sampler=make_sampler(search, seed=0, n_trials=8))
        study.optimize(lambda t: (t.suggest_float("x", -10, 10) - 3) ** 2, n_trials=8)
        return [t.params["x"] for t in study.trials]

    random, tpe = picks("random"), picks("tpe")
    assert tpe[:2] == random[:2], "the same seeded random start"
    assert tpe[2:] != random[2:], "then TPE's own proposals, not random search's"


@pytest.mark.slow
def test_a_tune_trial_shows_its_steps_on_the_status_line(tmp_path, cls_csv):
    """The running trial's steps reach the parent as they happen: the status line says the trial, step i/N, its
    loss, samples/s and the time left (on a terminal, the spinner's line)."""
    import contextlib

    import trainwise
    from trainwise.api.render import Render

    said: list[str] = []

    class Status:
        def update(self, text: str) -> None:
            said.append(text)

    render = Render(status=lambda _text: contextlib.nullcontext(Status()))
    space = _space(tmp_path, "lr: {low: 1.0e-4, high: 3.0e-3, log: true}\n")
    trainwise.tune(
        space=space, search="random", trials=1, model_preset="bert-tiny", train_file=str(cls_csv), max_length=32,
        batch_size=8, max_steps=4, eval_every=2, eval_samples=16, device="cpu", out=str(tmp_path / "t"), render=render,
    )  # fmt: skip
    steps = [line for line in said if line.startswith("trainwise tune: trial 0: step ")]
    assert [line.split()[5] for line in steps] == ["1/4", "2/4", "3/4", "4/4"], said
    assert "samples/s" in steps[-1] and "left" in steps[-2], steps
