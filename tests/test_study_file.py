"""Issue 25, part 6: study files. Every verb takes --config FILE.yaml whose keys are its option names;
flags given on the command line win; an unknown key, a wrong type or an unreadable file is one line and
exit 2, before anything runs. `trainwise.<verb>(config=...)` reads the same files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import trainwise
from trainwise.api import options as api
from trainwise.cli import main
from trainwise.errors import ConfigError

VERBS = {  # the verb, its options, and a key it does not have but something close
    "compare": (api.CompareOptions, "max_step", "max_steps"),
    "advise": (api.AdviseOptions, "memory-budge", "memory_budget"),
    "estimate": (api.EstimateOptions, "batch_sise", "batch_size"),
    "export": (api.ExportOptions, "strategy", "strategies"),
    "find-batch": (api.FindBatchOptions, "candidate", "candidates"),
    "train": (api.TrainOptions, "epoch", "epochs"),
    "tune": (api.TuneOptions, "trial", "trials"),
    "doctor": (api.DoctorOptions, "devices", "device"),
    "env": (api.EnvOptions, "devic", "device"),
}


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_names_an_unknown_key_and_the_closest(verb, tmp_path, capsys):
    options, wrong, right = VERBS[verb]
    path = tmp_path / "run.yaml"
    path.write_text(f"{wrong}: 3\n")
    argv = [verb, "--config", str(path)] + (["somewhere"] if verb == "advise" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"trainwise: error: --config {path}: unknown key {wrong!r} for {verb}; did you mean {right!r}?"
    assert right in {f.name for f in dataclasses.fields(options)}


@pytest.mark.parametrize(
    "text, says",
    [
        ("max_steps: eight\n", "--max-steps (in {path}): expected a whole number, got 'eight'"),
        ("remeasure: 3\n", "--remeasure (in {path}): expected true or false, got 3"),
        ("lr: [1, 2]\n", "--lr (in {path}): expected a number or nothing, got [1, 2]"),
        ("- max_steps\n", "--config {path}: expected option names and values (a mapping), got list"),
        ("max_steps: [\n", "--config {path}: not a readable YAML file"),
    ],
)
def test_a_bad_file_is_one_line_before_anything_is_written(tmp_path, capsys, text, says):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    assert main(["compare", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says.format(path=path) in err
    assert not (tmp_path / "out").exists()
    assert main(["compare", "--config", str(tmp_path / "none.yaml")]) == 2
    assert f"--config {tmp_path / 'none.yaml'}: no such file" in capsys.readouterr().err


def test_the_file_fills_the_options_and_flags_win(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text("model-preset: bert-tiny\nmax_steps: 8\nstrategies: [baseline, bf16]\nbatch_sizes: [8, 16]\n")
    o = api.CompareOptions.of({"max_steps": 4}, path)
    assert (o.model_preset, o.max_steps, o.strategies, o.batch_sizes) == ("bert-tiny", 4, ["baseline", "bf16"], [8, 16])
    cfg = o.resolve()[0]
    assert cfg.batch_sizes == (8, 16) and [r.text for r in cfg.rows] == ["baseline", "bf16"]
    assert o.batch_size == api.CompareOptions().batch_size, "what neither gives: the default"
    # what a run saves is read back equal, its paths absolute
    o = api.CompareOptions.of({"out": "runs/x", "train_file": "data.csv", "max_steps": 5})
    o.save(tmp_path / "saved.yaml")
    again = api.CompareOptions.of({}, tmp_path / "saved.yaml")
    here = Path.cwd()
    assert again == dataclasses.replace(o, out=str(here / "runs/x"), train_file=str(here / "data.csv"))


def test_the_api_reads_the_same_files(tmp_path):
    path = tmp_path / "estimate.yaml"
    path.write_text("model_preset: bert-tiny\nstrategies: baseline,bf16\nbatch_size: 8\nmax_length: 32\n")
    with pytest.raises(ConfigError, match="--batch-size: expected a whole number, got '8'"):
        trainwise.estimate(config=path, batch_size="8")
    report = trainwise.estimate(config=path, max_length=16)
    assert [name for name, _ in report.estimates] == ["baseline", "bf16"]
    assert {e.max_length for _, e in report.estimates} == {16} and {e.batch_size for _, e in report.estimates} == {8}


def test_advise_as_a_call_equals_the_cli_json(tmp_path, capsys):
    """trainwise.advise(study=[...]) is `trainwise advise --json`, over a study file's constraints too."""
    import json
    from pathlib import Path

    study = str(Path(__file__).parent / "data" / "study_rows" / "synthetic")
    path = tmp_path / "advise.yaml"
    path.write_text("objective: time\nmemory_budget: 900MiB\n")
    advice = trainwise.advise(config=path, study=[study])
    assert main(["advise", study, "--memory-budget", "900MiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(dataclasses.asdict(advice)))
    with pytest.raises(ConfigError, match="advise: --study is required"):
        trainwise.advise(objective="time")
