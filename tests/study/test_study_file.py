"""Issue 25, part 6: study files. Every verb takes --config FILE.yaml whose keys are its option names;
flags given on the command line win; an unknown key, a wrong type or an unreadable file is one line and
exit 2, before anything runs. `trainwise.<verb>(config=...)` reads the same files."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

import trainwise
from trainwise.api import options as api
from trainwise.cli import main
from trainwise.core.errors import ConfigError
from trainwise.study.resume import changed, over

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


def test_a_flag_naming_the_model_or_data_another_way_replaces_the_files(tmp_path):
    """--model and --model-preset name one thing two ways (as --dataset and --train-file): one given over a file's
    other is the run's, not "give either, not both" (seed 001's recipe names MiniLM; --model-preset bert-tiny wins)."""
    path = tmp_path / "study.yaml"
    path.write_text("model: all-MiniLM-L6-v2\ndataset: stdlib-topic\nmax_steps: 8\n")
    o = api.CompareOptions.of({"model_preset": "bert-tiny", "train_file": "data.csv"}, path)
    assert (o.model, o.model_preset, o.dataset, o.train_file, o.max_steps) == (None, "bert-tiny", None, "data.csv", 8)
    o = api.CompareOptions.of({"max_steps": 4}, path)
    assert (o.model, o.dataset) == ("all-MiniLM-L6-v2", "stdlib-topic"), "nothing given: the file's"
    path.write_text("model_preset: bert-tiny\ntrain_file: a.csv\neval_file: b.csv\n")
    o = api.CompareOptions.of({"dataset": "stdlib-topic"}, path)
    assert (o.dataset, o.train_file, o.eval_file) == ("stdlib-topic", None, None), "the file's data, whole, replaced"
    assert api.CompareOptions.of({"train_file": "c.csv"}, path).eval_file == "b.csv", "the same way: flags win"
    with pytest.raises(ConfigError, match="give either --model or --model-preset, not both"):
        api.CompareOptions.of({"model": "x", "model_preset": "bert-tiny"}).resolve()


def test_the_api_reads_the_same_files(tmp_path, monkeypatch):
    from trainwise.estimating.probe import NO_ACTIVATIONS

    # what is read, not what is measured: bf16's own calibration probe (~30 s on an AVX2 CPU) is test_estimate's
    monkeypatch.setattr(importlib.import_module("trainwise.api.estimate"), "calibrate", lambda *a, **k: NO_ACTIVATIONS)
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

    study = str(Path(__file__).resolve().parents[1] / "data" / "study_rows" / "synthetic")
    path = tmp_path / "advise.yaml"
    path.write_text("objective: time\nmemory_budget: 900MiB\n")
    advice = trainwise.advise(config=path, study=[study])
    assert main(["advise", study, "--memory-budget", "900MiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(dataclasses.asdict(advice)))
    with pytest.raises(ConfigError, match="advise: --study is required"):
        trainwise.advise(objective="time")


# ---- issue 34 (A): a run over a study already in --out never silently replaces its report -----------------------
SYNTHETIC = Path(__file__).resolve().parents[1] / "data" / "study_rows" / "synthetic"


def finished_study(tmp_path: Path, **options) -> Path:
    """A study on disk as compare leaves it (its study file and its report), without running a trial."""
    import shutil

    out = tmp_path / "study"
    shutil.copytree(SYNTHETIC, out)
    rows = "baseline,bf16,grad_ckpt,fp16,adafactor,zero2"  # its report's, at batch sizes 8 and 16
    study = {"out": str(out), "model_preset": "bert-tiny", "max_steps": 8, "strategies": rows, "batch_sizes": "8,16"}
    api.CompareOptions.of({**study, **options}).save(out / "study.yaml")
    return out


def test_other_settings_are_refused_naming_them_and_ways_out(tmp_path, capsys):
    """Issue 34: `--config runs/x/study.yaml --max-steps 4` rewrote runs/x's study file and report with a 4-step
    study. Now: one line, exit 2, naming each setting that differs (old → new) and the ways out; nothing written."""
    out = finished_study(tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert main(["compare", "--config", str(out / "study.yaml"), "--max-steps", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"trainwise: error: --out {out} holds a study measured with ")
    assert "(max_steps 8 → 4)" in err and "choose another --out" in err and "pass --replace" in err
    # --out EXISTING with the defaults: every setting the study does not share is named
    assert main(["compare", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model_preset bert-tiny → none; max_steps 8 → 16" in err
    with pytest.raises(ConfigError, match="max_steps 8 → 4"):
        trainwise.compare(config=out / "study.yaml", max_steps=4)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before, "nothing written"
    assert not (out / "data").exists() and not (out / "replaced").exists()


def test_the_measurement_is_compared_as_the_study_reads_it(tmp_path):
    """Two spellings of one study are one study (a list or comma text, a relative or absolute path, lr unset or
    the task's default, an option the task does not read); rows, a run's own options and a missing price are not
    differences; a price or a quality phase both give differently is."""
    o = api.CompareOptions.of({"out": "runs/x", "train_file": "data.csv", "batch_sizes": "8,16", "lr": 5e-5})
    same = {
        "train_file": str(Path("data.csv").resolve()),
        "batch_sizes": [8, 16],
        "lr": None,
        "batch_size": 32,  # a sweep runs its batch sizes
        "max_target_length": 12,  # classification reads no target length
        "strategies": "baseline,bf16",
        "trial_timeout": 60.0,
        "retries": 0,
        "replace": True,
        "sku": "ND40rs_v2",
    }
    assert changed(o, dataclasses.replace(o, **same)) == []
    assert changed(o, dataclasses.replace(o, batch_sizes=None)) == ["batch_sizes 16 → 8,16"]
    assert changed(o, dataclasses.replace(o, seed=1, device="cpu")) == ["seed 1 → 0", "device cpu → auto"]
    priced, requoted = dataclasses.replace(o, sku="ND40rs_v2"), dataclasses.replace(o, price_per_hour=3.0)
    assert changed(requoted, priced) == ["price_per_hour none → 3.0", "sku ND40rs_v2 → none"]
    quality = dataclasses.replace(o, quality_steps=40)
    assert changed(dataclasses.replace(o, quality_steps=80), quality) == ["quality_steps 40 → 80"]
    assert changed(o, quality) == [], "a run that asks for no quality phase keeps the study's"


def test_a_rerun_keeps_the_rows_price_and_quality_phase():
    """The same settings add rows (`a,b` then `a,b,c` adds c); the rows, the price and the quality phase the
    study's report has, which this run does not ask for, stay, each said in a note."""
    stored = api.CompareOptions.of({"out": "runs/x", "sku": "ND40rs_v2", "quality_steps": 40, "seeds": 3})
    more = api.CompareOptions.of({"out": "runs/x", "strategies": "baseline,dynamic_pad,bf16", "sku": "ND40rs_v2"})
    joined, notes = over(more, dataclasses.replace(stored, quality_steps=None), ["baseline", "dynamic_pad"])
    assert joined == more and notes == [], "adding a row: nothing to keep, nothing to say"
    fewer = api.CompareOptions.of({"out": "runs/x", "strategies": ["bf16"]})
    joined, notes = over(fewer, stored, ["baseline", "dynamic_pad", "bf16", "dynamic_pad"])
    assert joined.strategies == ["baseline", "dynamic_pad", "bf16"], "in the report's order"
    assert (joined.sku, joined.quality_steps, joined.seeds) == ("ND40rs_v2", 40, 3)
    assert len(notes) == 3 and "rows this run does not name: baseline, dynamic_pad" in notes[0]
    assert "stays priced" in notes[1] and "--quality-steps 40" in notes[2]


def test_a_study_file_never_holds_replace(tmp_path):
    """--replace is this run's decision: the study file it saves reruns the study without it."""
    api.CompareOptions.of({"replace": True}).save(tmp_path / "study.yaml")
    assert "replace" not in (tmp_path / "study.yaml").read_text()
    assert api.CompareOptions.of({}, tmp_path / "study.yaml").replace is False


def test_replace_keeps_the_report_aside_even_if_unreadable(tmp_path, capsys):
    """--replace copies the report it replaces into replaced/N/ (the next N each time), before anything is
    written; a study file this trainwise cannot read is refused as such, or replaced with --replace."""
    from trainwise.api.compare import over_study

    out = finished_study(tmp_path)
    results = (out / "results.json").read_bytes()
    notes: list[str] = []
    asked = api.CompareOptions.of({"out": str(out), "model_preset": "bert-tiny", "max_steps": 4, "replace": True})
    assert over_study(asked, notes.append) == asked
    assert (out / "replaced" / "1" / "results.json").read_bytes() == results
    assert "max_steps: 8" in (out / "replaced" / "1" / "study.yaml").read_text()
    assert notes == [f"trainwise: note: {out}: this run replaces its study; the report it had is in {out}/replaced/1"]
    same = api.CompareOptions.of({}, out / "study.yaml")
    assert over_study(dataclasses.replace(same, replace=True)) == dataclasses.replace(same, replace=True)
    assert not (out / "replaced" / "2").exists(), "the same study: nothing replaced, nothing kept"

    (out / "study.yaml").write_text("max_stepz: 8\n")
    assert main(["compare", "--out", str(out), "--max-steps", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds a study that cannot be read (--config" in err and "--replace" in err
    assert over_study(asked) == asked and (out / "replaced" / "2" / "study.yaml").read_text() == "max_stepz: 8\n"
