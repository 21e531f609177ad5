"""trainwise train: early stopping, checkpoints that survive SIGKILL, resume equivalence, bad input."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from tests import here
from trainwise.cli import main
from trainwise.core.errors import ConfigError
from trainwise.training.checkpoint import find_resumable, verify
from trainwise.training.fit import EarlyStopping, TrainConfig


def test_early_stopping_triggers_on_a_plateau():
    stop = EarlyStopping(patience=2, min_delta=0.05, higher_is_better=True)
    values = [50.0, 60.0, 61.0, 60.03, 60.04]  # +10, then gains below min_delta against the best (60)
    verdicts = [stop.update(v, step) for step, v in enumerate(values, 1)]
    assert [b for b, _ in verdicts] == [True, True, True, False, False]
    assert [s for _, s in verdicts] == [False, False, False, False, True]
    assert (stop.best, stop.best_step) == (61.0, 3)
    loss = EarlyStopping(patience=1, min_delta=0.0, higher_is_better=False)
    assert loss.update(2.0, 1) == (True, False) and loss.update(2.5, 2) == (False, True)
    never = EarlyStopping(patience=None, min_delta=0.0, higher_is_better=True)
    assert all(not never.update(1.0, s)[1] for s in range(10))


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"patience": 0}, "--patience must be >= 1"),
        ({"min_delta": -1.0}, "--min-delta must be a finite number >= 0"),
        ({"monitor": "vibes"}, "--monitor must be one of metric, eval_loss, train_loss"),
        ({"epochs": 0}, "--epochs must be > 0"),
    ],
)
def test_bad_train_settings(kw, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kw)


def _train(out, csv, *extra, env=None, fresh=False):
    """`trainwise train` on bert-tiny in this process, or with `fresh` in a new one (a run its fault kills)."""
    argv = ["train", "--model-preset", "bert-tiny", "--train-file", str(csv), "--batch-size", "8"]
    argv += ["--max-length", "32", "--epochs", "2", "--max-steps", "12", "--eval-every", "4"]
    argv += ["--save-every", "3", "--eval-samples", "16", "--device", "cpu", "--out", str(out), *extra]
    return here.trainwise(*argv, env=env, fresh=fresh)


def _result(out):
    return json.loads((out / "train_result.json").read_text())


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_final_loss(tmp_path, cls_csv):
    """A run killed at a random step resumes to the same final loss."""
    whole = _train(tmp_path / "whole", cls_csv)
    assert whole.returncode == 0, whole.stderr
    kill_at = random.Random(7).randint(4, 11)
    tb = ("--report-to", "tensorboard")
    killed = _train(tmp_path / "cut", cls_csv, *tb, env={"TRAINWISE_FAULT": f"train:kill@{kill_at}"}, fresh=True)
    assert killed.returncode == -9, killed.stderr
    root = tmp_path / "cut" / "checkpoints"
    assert verify(find_resumable(root, print)) is None, "latest is always a whole checkpoint"
    resumed = _train(tmp_path / "cut", cls_csv, "--resume", *tb)
    assert resumed.returncode == 0, resumed.stderr
    r, w = _result(tmp_path / "cut"), _result(tmp_path / "whole")
    assert r["resumed_from"] == f"ckpt-{3 * ((kill_at - 1) // 3):08d}"  # killed before that step's save
    assert r["steps"] == w["steps"] == 12
    assert r["final_loss"] == pytest.approx(w["final_loss"], abs=1e-4)
    assert [e["train_loss"] for e in r["evals"]] == pytest.approx([e["train_loss"] for e in w["evals"]], abs=1e-4)
    assert (tmp_path / "whole" / "best" / "model.safetensors").is_file()
    for directory in ("best", "final", "checkpoints/ckpt-00000012"):  # safetensors writes 0600: made as the rest
        modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "whole" / directory).iterdir() if p.is_file()}
        assert len(set(modes.values())) == 1, (directory, modes)
    # TensorBoard holds one curve: the steps the killed session logged after its checkpoint are purged
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curve = EventAccumulator(str(tmp_path / "cut" / "tensorboard"))
    curve.Reload()
    assert [e.step for e in curve.Scalars("train/loss")] == list(range(1, 13))
    assert curve.Scalars("train/loss")[-1].value == pytest.approx(w["final_loss"], abs=1e-4)


@pytest.mark.slow
def test_damaged_checkpoints_fall_back_other_plans_are_refused(tmp_path, cls_csv):
    out = tmp_path / "run"
    first = _train(out, cls_csv, "--max-steps", "6", "--price-per-hour", "3.6")
    assert first.returncode == 0, first.stderr
    cost = re.search(r"cost \$([0-9.e-]+) at \$3.6/h", first.stdout)
    wall = re.search(r"trained 6/6 steps in (\d+) s", first.stdout)
    assert cost and wall and float(cost.group(1)) == pytest.approx(3.6 * int(wall.group(1)) / 3600, abs=0.001)
    root = out / "checkpoints"
    latest = root / (root / "latest").read_text()
    (latest / "optimizer.safetensors").write_bytes(b"garbage")
    warnings = []
    assert find_resumable(root, warnings.append).name == "ckpt-00000003"
    assert "ckpt-00000006 is damaged (optimizer.safetensors does not match its checksum)" in warnings[0]
    other = _train(out, cls_csv, "--max-steps", "6", "--resume", "--strategies", "bf16")
    assert other.returncode == 2 and "another model, plan, data" in other.stderr
    fresh = _train(out, cls_csv, "--max-steps", "6")
    assert fresh.returncode == 2 and "add --resume" in fresh.stderr
    (root / "ckpt-00000003" / "model.safetensors").write_bytes(b"garbage")  # now none is whole
    anew = _train(out, cls_csv, "--max-steps", "2", "--resume")
    assert anew.returncode == 0, anew.stderr
    assert "--resume: no whole checkpoint (damaged: ckpt-00000003, ckpt-00000006)" in anew.stderr, anew.stderr


def test_train_bad_input_is_one_line(tmp_path, cls_csv, capsys):
    argv = ["train", "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--out", str(tmp_path / "x")]
    assert main([*argv, "--patience", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--patience must be >= 1" in err[0]
    assert main([*argv, "--strategies", "bf16,grad_ckpt"]) == 2
    assert "train runs one plan" in capsys.readouterr().err
    assert main([*argv, "--strategies", "zero2", "--nproc", "3"]) == 2  # checked before any rank starts
    assert "each micro-batch of 16 must split evenly over --nproc 3 ranks" in capsys.readouterr().err
    space = tmp_path / "space.yaml"
    space.write_text("lr: {low: 1.0e-5, high: 1.0e-3}\n")
    assert main(["tune", "--space", str(space), "--strategies", "zero3", "--out", str(tmp_path / "x")]) == 2
    assert "'zero3' needs 2 ranks (data parallel / ZeRO); tune runs one process" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    several = [*argv, "--nnodes", "2"]  # several machines: where they meet, and each one's place, checked first
    for extra, said in (
        ([], "--node-rank: give this machine's place, 0 to 1"),
        (["--node-rank", "2"], "--node-rank: give this machine's place, 0 to 1"),
        (["--node-rank", "1"], "needs --master-addr"),
        (
            ["--node-rank", "1", "--master-addr", "localhost", "--batch-size", "15"],
            "must split evenly over 2 ranks on 2 nodes",
        ),
        (
            ["--node-rank", "1", "--master-addr", "localhost", "--strategies", "grad_accum", "--batch-size", "12"],
            "multiple of 8",
        ),
        (["--node-rank", "1", "--master-addr", "no-such-host.invalid"], "--master-addr no-such-host.invalid: cannot"),
        (["--node-rank", "1", "--master-addr", "localhost", "--nproc", "2", "--nproc-per-node", "4"], "not both"),
    ):
        assert main([*several, *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (extra, err)
    assert main([*argv, "--node-rank", "1"]) == 2 and "with one node" in capsys.readouterr().err
    torchrun = here.trainwise(*argv, env={"LOCAL_RANK": "0"})
    assert torchrun.returncode == 2 and "not under torchrun" in torchrun.stderr
    assert not (tmp_path / "x").exists()


def test_the_command_export_writes_is_accepted_by_train(tmp_path, capsys):
    import shlex

    from trainwise.exporting.arguments import RunSettings
    from trainwise.exporting.commands import train_command

    run = RunSettings("t5-small", "seq2seq", 8, 64, 16, 1e-4, 10, model_is_preset=True, row="bf16+grad_ckpt")
    argv = shlex.split(train_command(run))[1:]
    # every exported option parses; the run stops at the first check of its own (a bad --patience)
    assert main([*argv, "--out", str(tmp_path / "x"), "--patience", "0"]) == 2
    assert "--patience must be >= 1" in capsys.readouterr().err


def _run(tmp_path, cls_csv, name, adopt=None, max_steps=8, **settings):
    """run_train in-process on bert-tiny; returns (result, step events)."""
    import dataclasses
    from pathlib import Path

    from tests.conftest import tiny_study
    from trainwise.run.events import Step
    from trainwise.training.fit import TrainJob, run_train

    spec = tiny_study(tmp_path / f"s-{name}", cls_csv, "classification", ["baseline"], accum_steps=1).specs[0]
    spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, **{"lr": 1e-3, **settings}))
    steps: list[Step] = []
    tc = TrainConfig(epochs=10, max_steps=max_steps, eval_every=4, save_every=4)
    emit = lambda e: steps.append(e) if isinstance(e, Step) else None  # noqa: E731
    r = run_train(TrainJob(spec, tc, Path(tmp_path / name)), emit, adopt=adopt)
    return r, steps


def test_early_stopping_watches_the_evaluation_loss_when_asked(tmp_path, cls_csv):
    """--monitor eval_loss (issue 15): every evaluation records the held-out loss, and the best step is the
    one with the lowest; --monitor metric keeps the highest accuracy."""
    import dataclasses
    from pathlib import Path

    from tests.conftest import tiny_study
    from trainwise.training.fit import TrainJob, run_train

    spec = tiny_study(tmp_path / "s", cls_csv, "classification", ["baseline"], accum_steps=1, eval_samples=16).specs[0]
    spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, lr=3e-3))
    for monitor, pick in (("eval_loss", min), ("metric", max)):
        tc = TrainConfig(epochs=10, max_steps=8, eval_every=2, save_every=8, monitor=monitor)
        r = run_train(TrainJob(spec, tc, Path(tmp_path / monitor)))
        key = "eval_loss" if monitor == "eval_loss" else "accuracy"
        values = [e[key] for e in r.evals]
        assert len(values) == 4 and all(v == v and v >= 0 for v in values)
        assert r.best_value == pick(values) and r.best_step == r.evals[values.index(pick(values))]["step"]
    assert all(0 < e["eval_loss"] < 10 for e in r.evals)  # a mean cross-entropy over 2 classes, not a sum


def test_label_smoothing_reaches_the_training_loss(tmp_path, cls_csv):
    _, plain = _run(tmp_path, cls_csv, "plain", max_steps=3)
    _, again = _run(tmp_path, cls_csv, "again", max_steps=3)
    _, smooth = _run(tmp_path, cls_csv, "smooth", max_steps=3, label_smoothing=0.3)
    assert [e.loss for e in plain] == [e.loss for e in again], "the loop is deterministic"
    assert [e.loss for e in plain] != [e.loss for e in smooth]


def test_pbt_adopts_a_checkpoint_with_new_hyper_parameters(tmp_path, cls_csv):
    donor, donor_steps = _run(tmp_path, cls_csv, "donor")
    ckpt = tmp_path / "donor" / "checkpoints" / f"ckpt-{4:08d}"
    # the same hyper-parameters: the adopted run continues the donor exactly (weights, optimizer,
    # schedule, sampler position and RNG all come from the checkpoint)
    same, same_steps = _run(tmp_path, cls_csv, "same", adopt=ckpt)
    assert [e.step for e in same_steps] == [5, 6, 7, 8]
    assert [e.loss for e in same_steps] == pytest.approx([e.loss for e in donor_steps[4:]], abs=1e-5)
    assert same.resumed_from == str(ckpt)
    # a new peak lr and weight decay: the same weights at step 5, then the new schedule
    new, new_steps = _run(tmp_path, cls_csv, "new", adopt=ckpt, lr=1e-2, weight_decay=0.1)
    assert new_steps[0].loss == pytest.approx(donor_steps[4].loss, abs=1e-5)
    # no warm-up, linear decay to 0 over the 8 steps: step n trains at peak x (8 - (n - 1)) / 8
    assert [e.lr for e in donor_steps] == pytest.approx([1e-3 * (9 - n) / 8 for n in range(1, 9)])
    assert [e.lr for e in new_steps] == pytest.approx([1e-2 * (9 - n) / 8 for n in range(5, 9)])
    assert new_steps[1].loss != pytest.approx(donor_steps[5].loss, abs=1e-5)
    # the next member's checkpoints are its own: the new lr is in their fingerprint
    with pytest.raises(ConfigError, match="another model, plan, data or batch"):
        _run(tmp_path, cls_csv, "other", adopt=ckpt, batch_size=4)


@pytest.mark.slow
def test_report_to_writes_the_same_curves_to_tb_and_mlflow(tmp_path, cls_csv, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    run = _train(out, cls_csv, "--max-steps", "6", "--eval-every", "3", "--report-to", "tensorboard,mlflow")
    assert run.returncode == 0, run.stderr
    result = _result(out)
    tb = EventAccumulator(str(out / "tensorboard"))
    tb.Reload()
    loss = [(e.step, e.value) for e in tb.Scalars("train/loss")]
    assert [s for s, _ in loss] == [1, 2, 3, 4, 5, 6]
    assert loss[-1][1] == pytest.approx(result["final_loss"], rel=1e-6)
    assert [e.step for e in tb.Scalars("eval/accuracy")] == [3, 6]
    assert [e.value for e in tb.Scalars("eval/accuracy")] == pytest.approx([e["accuracy"] for e in result["evals"]])
    assert tb.Scalars("train/lr")[0].value > tb.Scalars("train/lr")[-1].value > 0  # linear decay
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the run did: MLflow 3 keeps the file store behind it
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    run_id = (out / "mlflow_run_id").read_text().strip()
    logged = client.get_run(run_id)
    assert logged.info.status == "FINISHED"
    assert logged.data.params["plan"] == "baseline" and float(logged.data.params["lr"]) > 0
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "train/loss"))
    assert [s for s, _ in history] == [s for s, _ in loss]
    assert [v for _, v in history] == pytest.approx([v for _, v in loss], rel=1e-6)
    assert logged.data.metrics["result_steps"] == 6


def test_report_to_bad_input_is_one_line(tmp_path, cls_csv, capsys, monkeypatch):
    argv = ["train", "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--out", str(tmp_path / "r")]
    assert main([*argv, "--report-to", "comet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--report-to: unknown 'comet'; choose from tensorboard, mlflow, wandb" in err[0]
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    assert main([*argv, "--report-to", "tensorboard,mlflow"]) == 2
    assert "--report-to mlflow needs mlflow-skinny: pip install 'trainwise[report]'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_train_plan_takes_advises_pick_and_the_studys_settings(tmp_path, cls_csv, capsys):
    study = tmp_path / "study"
    compare = ["compare", "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--strategies", "baseline,bf16"]
    compare += ["--batch-size", "4", "--max-length", "24", "--max-steps", "3", "--warmup-steps", "1"]
    compare += ["--eval-samples", "8", "--device", "cpu", "--no-remeasure"]
    assert main([*compare, "--out", str(study)]) == 0
    from trainwise.search.ranking import Constraints, advise
    from trainwise.study.store import read_results

    pick = advise(read_results(study), Constraints()).recommended
    capsys.readouterr()
    assert (
        main(["train", "--plan", str(study), "--max-steps", "2", "--eval-every", "2", "--out", str(tmp_path / "r")])
        == 0
    )
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert f"{pick!r}, the plan advise recommends in {study}" in err
    # the study's model and batch: the checkpoint's fingerprint is the one of the study's trial spec
    from trainwise.api.stored import study_spec
    from trainwise.training.fit import fingerprint

    manifest = json.loads((tmp_path / "r" / "checkpoints" / f"ckpt-{2:08d}" / "extra.json").read_text())
    spec = study_spec(study, pick, print)
    assert spec.settings.batch_size == 4 and spec.settings.max_length == 24
    import dataclasses

    ran = dataclasses.replace(spec, steps=2)
    assert manifest["trainer"]["fingerprint"] == fingerprint(ran)
    for args, message in (
        (["--strategies", "nope"], "no row 'nope'; its rows: baseline, bf16"),
        (["--model-preset", "bert-tiny"], "leave out --model-preset"),
    ):
        assert main(["train", "--plan", str(study), "--out", str(tmp_path / "x"), *args]) == 2
        assert message in capsys.readouterr().err
    assert main(["train", "--plan", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "--plan" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_help_shows_bracketed_defaults_and_extras(capsys, monkeypatch):
    """Rich reads [...] in help text as markup and drops it unless escaped."""
    monkeypatch.setenv("COLUMNS", "250")
    for argv, shown in (
        (["train", "--help"], ("[default: baseline]", "trainwise[report]")),
        (["tune", "--help"], ("trainwise[ray]",)),
        (["compare", "--help"], ("[default: text]", "[default: 5e-05 (fine-tuning text)")),
    ):
        assert main(argv) == 0
        out = " ".join(capsys.readouterr().out.replace("│", " ").split())
        for text in shown:
            assert text in out, (argv, text)


@pytest.mark.parametrize("row", ["baseline", "lora"])
def test_the_trained_model_is_a_directory_a_pipeline_loads(tmp_path, row):
    """best/ and final/ load with transformers alone and predict the data's label names (a LoRA plan's
    adapters merged in: no peft needed), from a CSV with string labels in columns not called text/target."""
    from transformers import AutoModelForSequenceClassification, pipeline

    from tests.conftest import make_rows, write_csv

    rows = [{"review": r["text"], "sentiment": f"label {r['target']}"} for r in make_rows(48, "classification")]
    data = write_csv(tmp_path / "reviews.csv", rows)
    argv = ["train", "--strategies", row, "--model-preset", "bert-tiny", "--train-file", str(data)]
    argv += ["--text-column", "review", "--target-column", "sentiment", "--batch-size", "8", "--max-length", "32"]
    argv += ["--max-steps", "4", "--eval-every", "2", "--eval-samples", "16", "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    names = {r["sentiment"] for r in rows}
    for kind in ("best", "final"):
        where = tmp_path / "run" / kind
        assert not (where / "adapter_config.json").exists()
        model = AutoModelForSequenceClassification.from_pretrained(where)
        assert set(model.config.id2label.values()) == names and model.config.label2id.keys() == names
        classify = pipeline("text-classification", model=str(where), device="cpu")
        predicted = classify([rows[0]["review"], rows[1]["review"]])
        assert len(predicted) == 2 and all(p["label"] in names for p in predicted)


@pytest.mark.slow
# zero2 kills ranks that hold partitioned state; the baseline's two ranks resume the same way (and one rank's
# kill and resume is test_a_killed_run_resumes_to_the_same_final_loss): `make bench` runs both
@pytest.mark.parametrize("row", ["zero2", pytest.param("baseline", marks=pytest.mark.bench)])
def test_two_ranks_killed_and_resumed_end_at_the_same_loss(tmp_path, cls_csv, row, request):
    """train --nproc 2 on CPU (gloo), ZeRO-2 (every rank checkpoints its partition) and plain DDP (rank 0
    writes the replicas): a SIGKILL of the ranks at a random step, then --resume, ends with the losses of
    a run that was never interrupted."""
    ranks = ("--strategies", row, "--nproc", "2")
    if row == "zero2":
        w = request.getfixturevalue("zero2_whole")
    else:
        whole = _train(tmp_path / "whole", cls_csv, *ranks)
        assert whole.returncode == 0, whole.stderr
        w = _result(tmp_path / "whole")
    kill_at = random.Random(11).randint(4, 11)
    killed = _train(tmp_path / "cut", cls_csv, *ranks, env={"TRAINWISE_FAULT": f"train:kill@{kill_at}"})
    assert killed.returncode == 1, killed.stderr
    error = [line for line in killed.stderr.splitlines() if line.startswith("trainwise: error:")]
    assert len(error) == 1 and "exit code -9" in error[0] and "SIGKILL" in error[0], killed.stderr
    ckpt = find_resumable(tmp_path / "cut" / "checkpoints", print)
    assert ckpt is not None and verify(ckpt) is None and (ckpt / "zero").is_dir() == (row == "zero2")
    resumed = _train(tmp_path / "cut", cls_csv, *ranks, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    r = _result(tmp_path / "cut")
    assert r["resumed_from"] == f"ckpt-{3 * ((kill_at - 1) // 3):08d}"
    assert r["steps"] == w["steps"] == 12
    assert r["final_loss"] == pytest.approx(w["final_loss"], abs=1e-4)
    assert [e["train_loss"] for e in r["evals"]] == pytest.approx([e["train_loss"] for e in w["evals"]], abs=1e-4)


def _two_nodes(out, csv, *extra, env=None, outs=None):
    """`trainwise train` as two machines would run it: one command per node (--nnodes 2 --node-rank R, one rank
    each, static rendezvous on this host), both at once; `outs`: each node's own --out (default: one shared)."""
    import subprocess
    import sys

    port = here.free_port()
    argv = ["train", "--model-preset", "bert-tiny", "--train-file", str(csv), "--batch-size", "8"]
    argv += ["--max-length", "32", "--epochs", "2", "--max-steps", "12", "--eval-every", "4"]
    argv += ["--save-every", "3", "--eval-samples", "16", "--device", "cpu", "--strategies", "zero2", *extra]
    argv += ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    full = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainwise.cli",
                *argv,
                "--node-rank",
                str(r),
                "--out",
                str((outs or [out, out])[r]),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full,
        )  # fmt: skip
        for r in (0, 1)
    ]
    return [subprocess.CompletedProcess(n.args, n.wait(timeout=600), *n.communicate()) for n in nodes]


@pytest.fixture(scope="module")
def zero2_whole(tmp_path_factory, cls_csv):
    """An uninterrupted ZeRO-2 run over two ranks on one machine: the losses a killed and resumed run must end with."""
    out = tmp_path_factory.mktemp("zero2") / "whole"
    whole = _train(out, cls_csv, "--strategies", "zero2", "--nproc", "2")
    assert whole.returncode == 0, whole.stderr
    assert "over 2 ranks" in whole.stderr
    return _result(out)


@pytest.mark.slow
def test_two_nodes_killed_and_resumed_end_at_one_machines_loss(tmp_path, cls_csv, zero2_whole):
    """torchrun --nnodes 2 on this host (two node agents, gloo, static rendezvous), ZeRO-2 (each rank writes its
    partition into the shared --out): every rank killed at a step, then both nodes --resume; the run ends with the
    losses of the same two ranks on one machine."""
    kill_at = random.Random(5).randint(4, 11)
    killed = _two_nodes(tmp_path / "cut", cls_csv, env={"TRAINWISE_FAULT": f"train:kill@{kill_at}"})
    assert [k.returncode for k in killed] == [1, 1], [k.stderr[-2000:] for k in killed]
    assert "node 1 of 2" in killed[1].stderr and "rank 0 (node 0) reports" in killed[1].stderr
    ckpt = find_resumable(tmp_path / "cut" / "checkpoints", print)
    assert ckpt is not None and verify(ckpt) is None and (ckpt / "zero").is_dir()
    shards = {p.name for p in (ckpt / "zero").rglob("*optim_states.pt")}
    assert len(shards) == 2, ("a partition from each node's rank", shards)
    resumed = _two_nodes(tmp_path / "cut", cls_csv, "--resume")
    assert [r.returncode for r in resumed] == [0, 0], [r.stderr[-2000:] for r in resumed]
    assert (tmp_path / "cut" / "ranks.node0.log").is_file() and (tmp_path / "cut" / "ranks.node1.log").is_file()
    r, w = _result(tmp_path / "cut"), zero2_whole
    assert r["resumed_from"] == f"ckpt-{3 * ((kill_at - 1) // 3):08d}"
    assert r["steps"] == w["steps"] == 12
    assert r["final_loss"] == pytest.approx(w["final_loss"], abs=1e-4)
    assert [e["train_loss"] for e in r["evals"]] == pytest.approx([e["train_loss"] for e in w["evals"]], abs=1e-4)


def _check_shared_as(rank: int, port: int, outs: list[str], said) -> None:
    """One rank of two (gloo on this host) running train's check of --out before any training."""
    import torch

    from trainwise.training.checkpoint import check_shared

    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        check_shared(Path(outs[rank]))
        said.put((rank, None))
    except ConfigError as e:
        said.put((rank, str(e)))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("shared", [True, False])
def test_every_rank_refuses_an_out_that_is_not_one_shared_folder(tmp_path, shared):
    """Ranks of a run over several machines read back what rank 0 wrote in --out before any training: where the
    folder is not one shared by every node (here each rank has its own), every rank says so in one line; a shared one
    passes and is left as it was. (Two real node agents refusing it: the `bench` test below.)"""
    import multiprocessing

    outs = [str(tmp_path / "a"), str(tmp_path / ("a" if shared else "b"))]
    for o in outs:
        Path(o).mkdir(exist_ok=True)
    ctx = multiprocessing.get_context("fork")  # (this process has torch imported: the ranks start at once)
    said, port = ctx.Queue(), here.free_port()
    ranks = [ctx.Process(target=_check_shared_as, args=(r, port, outs, said)) for r in (0, 1)]
    for p in ranks:
        p.start()
    got = dict(said.get(timeout=120) for _ in ranks)
    for p in ranks:
        p.join(timeout=60)
    if shared:
        assert got == {0: None, 1: None} and not any(Path(outs[0]).iterdir()), got
    else:
        assert all(e and "is not one folder shared by every node" in e and "\n" not in e for e in got.values()), got


@pytest.mark.bench
def test_two_nodes_without_one_shared_out_are_refused_on_both(tmp_path, cls_csv):
    """The check of --out comes before any training, on both node agents: plain DDP ranks (no DeepSpeed to import)
    say it in one line each (`make bench`: two node agents cost the suite 16 s; the check itself is the test above)."""
    apart = _two_nodes(tmp_path / "a", cls_csv, "--strategies", "baseline", outs=[tmp_path / "a", tmp_path / "b"])
    for node in apart:
        error = [line for line in node.stderr.splitlines() if line.startswith("trainwise: error:")]
        assert node.returncode != 0 and len(error) == 1 and "is not one folder shared by every node" in error[0], (
            node.stderr[-2000:]
        )


@pytest.mark.slow
def test_zero3_ranks_gather_their_weights_into_a_usable_model(tmp_path, cls_csv):
    """ZeRO-3 partitions the weights over the ranks; final/ holds them whole, loadable by transformers."""
    from transformers import AutoModelForSequenceClassification

    done = _train(tmp_path / "z3", cls_csv, "--strategies", "zero3", "--nproc", "2", "--max-steps", "4")
    assert done.returncode == 0, done.stderr
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "z3" / "final")
    weights = model.get_input_embeddings().weight
    assert weights.shape[0] > 100 and float(weights.abs().sum()) > 0  # not ZeRO-3's empty placeholders


def test_a_failed_rank_reports_its_cause_not_torchruns_banner(tmp_path):
    from trainwise.run.launcher import rank_failure

    banner = "=" * 53
    report = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        banner,
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : -9 (pid: 2366)  (SIGKILL)",
        "  traceback : Signal 9 (SIGKILL) received by PID 2366",
        banner,
    ]
    killed = tmp_path / "killed.log"
    killed.write_text("\n".join(["some warning", *report]))
    assert (
        rank_failure(killed)
        == "rank 0 (local_rank: 0): exit code -9 (pid: 2366)  (SIGKILL), Signal 9 (SIGKILL) received by PID 2366"
    )
    raised = tmp_path / "raised.log"
    raised.write_text(
        "\n".join(["Traceback (most recent call last):", "ValueError: every parameter is frozen", *report])
    )
    assert rank_failure(raised) == "ValueError: every parameter is frozen"


def test_multi_node_options_default_to_slurm_and_torchrun_env(monkeypatch):
    """Under `srun --ntasks-per-node=1 trainwise train ...` each node's command finds its place in Slurm's
    variables and the master in MASTER_ADDR / MASTER_PORT; the options, when given, win."""
    from trainwise.api.options import TrainOptions
    from trainwise.run.ranks import Rendezvous

    monkeypatch.setenv("SLURM_STEP_ID", "0")  # inside an srun step (a batch script's own step is one node)
    monkeypatch.setenv("SLURM_NNODES", "4")
    monkeypatch.setenv("SLURM_NODEID", "3")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.delenv("MASTER_PORT", raising=False)

    def meeting(options: TrainOptions) -> Rendezvous | None:  # where trainwise.api.train's ranks meet
        return Rendezvous.resolve(options.nnodes, options.node_rank, options.master_addr, options.master_port)

    meet = meeting(TrainOptions.of({"nproc_per_node": 2}))
    assert meet == Rendezvous(4, 3, "localhost", 29500)
    assert meet.torchrun_args() == ["--nnodes=4", "--node_rank=3", "--master_addr=localhost", "--master_port=29500"]
    given = TrainOptions.of({"nnodes": 2, "node_rank": 0, "master_addr": "127.0.0.1", "master_port": 1234})
    assert meeting(given) == Rendezvous(2, 0, "127.0.0.1", 1234), "the options win"
    monkeypatch.delenv("SLURM_STEP_ID")
    assert meeting(TrainOptions.of({})) is None, "a batch script's own step, not srun's: one node"
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_NNODES", "1")
    assert meeting(TrainOptions.of({})) is None, "one node: torchrun --standalone, as before"
    monkeypatch.setenv("SLURM_NNODES", "two")
    with pytest.raises(ConfigError, match="SLURM_NNODES='two': expected a whole number"):
        meeting(TrainOptions.of({}))
