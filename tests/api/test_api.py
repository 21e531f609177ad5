"""Issue 25 (first part): the Python API. The docs' and README's examples run as written; the API and the
CLI give the same rows for one study; bad keyword arguments are one ConfigError, as bad flags are."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest

import trainwise
from trainwise.cli import main
from trainwise.core.errors import ConfigError
from trainwise.study.store import read_rows

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(doc: Path) -> str:
    return "\n".join(re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S))


@contextlib.contextmanager
def inside(path: Path):
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def api_study(tmp_path_factory):
    """docs/python-api.md's example, run as written (in a fresh directory): its study."""
    where = tmp_path_factory.mktemp("api")
    with inside(where):
        scope: dict = {}
        exec(compile(python_blocks(ROOT / "docs" / "python-api.md"), "python-api.md", "exec"), scope)
    return where / "runs" / "api-demo", scope


@pytest.mark.slow
def test_the_docs_example_runs_and_returns_the_study_it_wrote(api_study):
    out, scope = api_study
    study = scope["study"]
    assert [r.strategy for r in study.rows] == ["baseline", "dynamic_pad"]
    assert all(r.status == "ok" for r in study.rows)
    table = scope["table"]
    assert list(table["strategy"]) == ["baseline", "dynamic_pad"] and "env.device_name" in table.columns
    assert study.settings["command"].startswith(f"trainwise compare --out {out}")
    assert scope["advice"].verdicts and "dynamic_pad" in study._repr_html_()


@pytest.mark.slow
def test_the_readme_example_runs_and_resumes_the_same_study(api_study):
    out, _ = api_study
    with inside(out.parent.parent):  # the README's call is the docs' study: every trial from the store
        scope: dict = {}
        exec(compile(python_blocks(ROOT / "README.md"), "README.md", "exec"), scope)
    assert scope["study"].rows == trainwise.open(out).rows


@pytest.mark.slow
def test_the_api_and_the_cli_give_the_same_rows(api_study, tmp_path):
    out, _ = api_study
    argv = ["compare", "--model-preset", "bert-tiny", "--strategies", "baseline,dynamic_pad", "--max-steps", "4"]
    assert main([*argv, "--warmup-steps", "1", "--no-remeasure", "--out", str(tmp_path / "cli")]) == 0
    same = ("strategy", "status", "train_loss", "metric", "padding_waste", "state_bytes", "flops_per_step", "repeats")
    cli = [{k: r.get(k) for k in same} for r in read_rows(tmp_path / "cli" / "results.json")]
    api = [{k: getattr(r, k) for k in same} for r in trainwise.open(out).rows]
    assert cli == api


@pytest.mark.parametrize(
    "options, says",
    [
        ({"max_step": 3}, "compare: unknown option 'max_step'; did you mean 'max_steps'?"),
        ({"max_steps": 0}, "--max-steps must be > 0, got 0"),
        ({"strategies": ["baseline", "warp_drive"]}, "warp_drive"),
        ({"batch_sizes": "8,x"}, "--batch-sizes '8,x': give whole numbers"),
        ({"quality_steps": 0}, "--quality-steps"),
    ],
)
def test_bad_keywords_are_one_config_error_before_a_run(tmp_path, options, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        trainwise.compare(out=str(tmp_path / "x"), **options)
    assert not (tmp_path / "x").exists(), "nothing written"


def test_open_refuses_what_is_not_a_study(tmp_path):
    with pytest.raises(ConfigError, match="no results.json"):
        trainwise.open(tmp_path)
    with pytest.raises(ConfigError, match="advise: unknown option 'budget'"):
        trainwise.api.study.Study.advise(object.__new__(trainwise.api.study.Study), budget="8GiB")


def test_the_cli_and_the_api_share_their_compare_defaults():
    """One list of compare's options: the CLI's flags are the API's keyword arguments, same defaults."""
    from dataclasses import fields

    from typer.main import get_command

    from trainwise.api.compare import CompareOptions
    from trainwise.cli import app

    cli = {p.name: p.default for p in get_command(app).commands["compare"].params}  # type: ignore[attr-defined]
    assert cli.pop("config") is None  # --config: the file the options come from, not an option of the study
    assert cli.pop("recipe") is None  # --recipe: a shipped such file
    api = {f.name: f.default for f in fields(CompareOptions)}
    assert cli == api


@pytest.mark.slow
def test_a_call_shows_progress_on_stderr_render_none_silences(api_study, capsys):
    """Issue 34: a notebook's compare waited minutes in silence. By default a call shows what the CLI shows on
    stderr (the study's line, each trial, the study's notes), leaving the table to the returned study;
    `render=None` shows nothing."""
    out, _ = api_study
    capsys.readouterr()
    trainwise.compare(config=out / "study.yaml", strategies=["baseline"])
    shown = capsys.readouterr()
    assert shown.out == "", "the table is the returned study's"
    assert f"out {out}" in shown.err and "(stored) baseline #1: ok" in shown.err
    assert "trainwise: note: " in shown.err and "rows this run does not name: dynamic_pad" in shown.err
    trainwise.compare(config=out / "study.yaml", strategies=["baseline"], render=None)
    assert capsys.readouterr() == ("", "")


def test_every_verb_shows_on_stderr_by_default(capsys):
    """Every verb's default render is the terminal's on stderr, loaded when it first shows something."""
    import inspect

    from trainwise.api.render import SILENT, STDERR, Render

    for verb in ("advise", "compare", "doctor", "estimate", "find_batch", "train", "tune"):
        assert inspect.signature(getattr(trainwise, verb)).parameters["render"].default is STDERR, verb
    STDERR.note("trainwise: note: waiting for the machine to quieten")
    assert capsys.readouterr() == ("", "trainwise: note: waiting for the machine to quieten\n")
    assert Render.of(None) is SILENT and Render.of(STDERR) is STDERR
