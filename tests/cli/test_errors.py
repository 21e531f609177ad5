"""Bad input: one line on stderr, exit code 2, no traceback, nothing written to --out."""

from __future__ import annotations

import pytest

from tests.conftest import make_rows, write_csv
from trainwise.cli import main


@pytest.fixture
def data(tmp_path):
    write_csv(tmp_path / "ok.csv", make_rows(40, "classification"))
    (tmp_path / "latin1.csv").write_bytes(b"text,target\ncaf\xe9 au lait,a\n")
    (tmp_path / "empty.csv").write_text("text,target\n")
    (tmp_path / "nodir").mkdir()
    (tmp_path / "nodir" / "weights.bin").write_text("x")
    (tmp_path / "afile").write_text("x")
    return tmp_path


TINY = ["--model-preset", "bert-tiny", "--max-steps", "2", "--warmup-steps", "1"]

CASES = {
    "unknown strategy": (["--strategies", "baseline,turbo"], "unknown strategy 'turbo'"),
    "conflicting strategies": (["--strategies", "bf16+fp16"], "conflict"),
    "cuda-only on cpu": (["--strategies", "baseline,fp16", "--device", "cpu"], "'fp16' needs cuda"),
    "missing data file": (["--train-file", "{d}/missing.csv"], "data file not found"),
    "unreadable data file": (["--train-file", "{d}/nodir"], "not a regular file"),
    "missing column": (
        ["--train-file", "{d}/ok.csv", "--text-column", "body"],
        "no column 'body' .--text-column.; columns are: id, target, text",
    ),
    "empty dataset": (["--train-file", "{d}/empty.csv"], "no usable rows"),
    "non-utf8": (["--train-file", "{d}/latin1.csv"], "not UTF-8"),
    "batch size 0": (["--batch-size", "0"], "--batch-size must be > 0"),
    "negative steps": (["--max-steps", "-3"], "--max-steps must be > 0"),
    "warmup >= steps": (["--warmup-steps", "2"], "--warmup-steps must be"),
    "out under a file": (["--out", "{d}/afile/sub"], "afile is a file, not a directory"),
    "unknown preset": (["--model-preset", "gpt-17"], "unknown model preset 'gpt-17'"),
    "model dir without config": (["--model", "{d}/nodir"], "has no config.json"),
    "hub id offline": (["--model", "org/not-cached-model"], "cannot load model 'org/not-cached-model'"),
    "bad accum": (["--strategies", "grad_accum", "--batch-size", "6", "--accum-steps", "4"], "multiple of"),
    "not an int": (["--batch-size", "many"], "Invalid value for '--batch-size'"),
    "batch sweep not ints": (["--batch-sizes", "8,lots"], "--batch-sizes '8,lots': give whole numbers"),
    "batch sweep zero": (["--batch-sizes", "0,8"], "--batch-sizes must all be > 0"),
    "negative workers": (["--num-workers", "0,-1"], "--num-workers must all be >= 0"),
    "sweep vs accum": (["--strategies", "grad_accum", "--batch-sizes", "8,6"], "batch size 6 into --accum-steps 4"),
    "sweep larger than data": (["--batch-sizes", "8,100000"], "fewer than the batch size 100000"),
    "unknown option": (["--turbo"], "No such option"),
    "bad device": (["--device", "tpu"], "--device must be one of"),
    "nproc 0": (["--nproc", "0"], "--nproc must be between 1 and 64"),
    "batch not split over ranks": (
        ["--strategies", "grad_accum", "--batch-size", "8", "--accum-steps", "4", "--nproc", "4"],
        "micro-batch of 2 must split evenly over --nproc 4 ranks; use a batch size that is a multiple of 16",
    ),
    "conflicting zero stages": (["--strategies", "zero2+zero3"], "conflict"),
    "zero offload with another optimizer": (["--strategies", "zero2_offload+adafactor"], "conflict"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2(case, data, tmp_path, capsys):
    args, expected = CASES[case]
    out = tmp_path / "study"
    argv = ["compare", *TINY, "--out", str(out)]
    if "--model-preset" in args or "--model" in args:
        argv = ["compare", "--max-steps", "2", "--warmup-steps", "1", "--out", str(out)]
    argv += [a.format(d=data) for a in args]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trainwise: error: ")
    import re

    assert re.search(expected, lines[0]), lines[0]
    assert "Traceback" not in err
    assert not out.exists(), "nothing half-written"


@pytest.mark.parametrize("command", ["compare", "advise", "estimate"])
def test_help_shows_the_whole_default_row_list(capsys, monkeypatch, command):
    """Issue 27: --strategies' default is one long comma list, which rich cut at the column's width
    ("baseline,bf16,fp16,grad_accum,grad_ckpt,adafactor,dynamic_p…"); shown spaced, it wraps whole."""
    from trainwise import strategies

    monkeypatch.setenv("COLUMNS", "80")
    rows = strategies.ESTIMATE_STRATEGIES if command == "estimate" else strategies.DEFAULT_STRATEGIES
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert f"[default: ({', '.join(rows.split(','))})]" in text


def test_help_documents_every_flag_with_defaults(capsys):
    assert main(["compare", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in (
        "--model",
        "--model-preset",
        "--task",
        "--dataset",
        "--train-file",
        "--eval-file",
        "--text-column",
        "--target-column",
        "--strategies",
        "--batch-size",
        "--max-length",
        "--max-steps",
        "--warmup-steps",
        "--repeat",
        "--device",
        "--out",
        "--trial-timeout",
    ):
        assert flag in text
    assert "[default: 16]" in text and "runs/compare" in text


def test_a_hub_dataset_offline_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "study"
    code = main(["compare", *TINY, "--dataset", "someone/not-a-local-dataset", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "cannot load dataset 'someone/not-a-local-dataset'" in err[0] and "stdlib-topic" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("verb", ["compare", "train"])
def test_an_out_dir_with_the_users_files_is_refused_unless_force(tmp_path, cls_csv, capsys, verb):
    """--out naming a folder with files trainwise did not write: one line, exit 2, the files untouched."""
    from trainwise.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    argv = [verb, "--model-preset", "bert-tiny", "--train-file", str(cls_csv), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds files trainwise did not write (report.md)" in err[0] and "--force" in err[0]
    assert sorted(p.name for p in out.iterdir()) == ["report.md"] and (out / "report.md").read_text() == "my notes"


def test_export_over_the_users_files_needs_force(tmp_path, capsys):
    """Export into a folder with the user's files is refused unless --force."""
    from trainwise.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "training_args.json").write_text("{}")
    argv = ["export", "--strategies", "bf16", "--model-preset", "bert-tiny", "--out", str(out)]
    assert main(argv) == 2
    assert "holds files trainwise did not write (training_args.json)" in capsys.readouterr().err
    assert (out / "training_args.json").read_text() == "{}"
    assert main([*argv, "--force"]) == 0 and (out / "training_args.json").read_text() != "{}"
    assert main(argv) == 0, "trainwise's own export folder is rewritten without --force"


def test_the_cli_stays_thin():
    """Issue 12: the CLI parses options and prints; the work is in the library (600 lines at most)."""
    from pathlib import Path

    import trainwise.cli

    package = Path(trainwise.cli.__file__).parent
    assert sum(len(p.read_text().splitlines()) for p in package.glob("*.py")) <= 600
