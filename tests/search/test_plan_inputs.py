"""What `trainwise plan` reads and measures beside the user's rows: the ecosystem's default read from the installed
TRL / transformers (at its own batch size, the fields the study overrode said), each task's own default rows
(recorded 'unsupported' where the device lacks them, also with an explicit --device), a study's rows as the model's
inputs (phases per sample, a strategy that runs only beside another), a missing metric package said once, and the
commit a study records."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.search import ecosystem
from trainwise.search.plan_inputs import Key, observations, plan_of, pool, split_row

ORDER = list(strategies.REGISTRY)


@pytest.fixture(scope="module")
def pr_csv(tmp_path_factory) -> Path:
    from tests.conftest import write_csv
    from tests.training.test_causal_lm import pairs

    return write_csv(tmp_path_factory.mktemp("inputs") / "pr.csv", pairs(32))


def test_a_causal_lm_default_is_trls_sftconfig_as_installed():
    """TRL 1.16's SFTConfig: bf16 unless fp16, gradient checkpointing on, fused AdamW, batches padded to their longest,
    and a loss that never holds the full logits. Each is read off the installed class, not a table of ours."""
    trl = pytest.importorskip("trl")
    fields = ecosystem.defaults_of(trl.SFTConfig)
    found = ecosystem.default_for("causal-lm", "cuda")
    assert found.source.startswith("TRL ") and "SFTConfig()" in found.source
    names = set(found.row.split("+"))
    assert ("grad_ckpt" in names) == bool(fields["gradient_checkpointing"])
    assert ("bf16" in names) == (fields["bf16"] is None or bool(fields["bf16"])) and not fields["fp16"]
    assert ("adamw_fused" in names) == (fields["optim"] == "adamw_torch_fused")
    assert ("packing" in names) == bool(fields["packing"]) and "dynamic_pad" in names and "chunked_ce" in names
    assert found.fields["grad_ckpt"] == "gradient_checkpointing=True"
    # its own batch, length and rate: the study runs the first where the data allows and names what it overrode
    assert found.batch == fields["per_device_train_batch_size"] and found.max_length == fields["max_length"]
    said = ecosystem.overridden(found, 64, 1e-4, 4)
    assert any(f"per_device_train_batch_size {found.batch}: run at the study's 4" in n for n in said), said
    assert any(f"max_length {found.max_length}: the study's 64" in n for n in said)
    assert any("learning_rate" in n and "the study's 0.0001" in n for n in said)
    assert ecosystem.overridden(found, found.max_length, found.learning_rate, found.batch) == []
    assert strategies.parse_row(found.row, 4).wrong_task("causal-lm") is None  # a row the study can run


def test_other_tasks_default_to_the_trainers_runnable_settings():
    """The ecosystem default of the other tasks is the Trainer's, less what the device cannot run."""
    from transformers import TrainingArguments

    optim = ecosystem.defaults_of(TrainingArguments)["optim"]
    for task in ("classification", "seq2seq"):
        found = ecosystem.default_for(task, "cpu")
        assert "TrainingArguments()" in found.source and "dynamic_pad" in found.row.split("+")
        assert ("adamw_fused" in found.row) == (optim == "adamw_torch_fused") and "bf16" not in found.row
    image = ecosystem.default_for("image-classification", "cpu")
    assert "dynamic_pad" not in image.row  # no padding for images
    # a library default the device cannot run is left out, and said: bf16 where the registry refuses it
    refuse = ecosystem.build(
        "causal-lm",
        "cpu",
        {"bf16": True, "optim": "adamw_torch"},
        "x",
        lambda row: "no" if "bf16" in row else None,
        True,
    )
    assert "bf16" not in refuse.row and any(n.startswith("bf16: left out") for n in refuse.notes)
    packed = ecosystem.build("causal-lm", "cpu", {"packing": True, "optim": "adamw_torch"}, "x", lambda _r: None, True)
    assert "packing" in packed.row and "dynamic_pad" not in packed.row


def test_default_rows_the_device_cannot_run_are_recorded(tmp_path, pr_csv):
    """`trainwise plan --device cpu` with the default rows stopped at once on fp16 ("needs cuda ... drop it"): the
    user never chose it. --task image-classification's defaults held dynamic_pad. Default rows are the task's, and
    those the device cannot run are recorded 'unsupported', also with an explicit --device."""
    from trainwise.api.options import CompareOptions
    from trainwise.study.prepare import prepare_study

    image = CompareOptions(task="image-classification", out=str(tmp_path / "i")).resolve()[0]
    assert [r.text for r in image.rows] == list(strategies.default_rows("image-classification"))
    assert not any(r.wrong_task("image-classification") for r in image.rows)
    lm = dict(task="causal-lm", model_preset="gpt2-tiny", train_file=str(pr_csv), out=str(tmp_path / "lm"))
    lm |= dict(prompt_column="question", response_column="answer")
    lm |= dict(device="cpu", batch_size=4, max_length=32, max_steps=2, warmup_steps=1, eval_samples=0)
    cfg = CompareOptions(**lm).resolve()[0]
    assert {"packing", "chunked_ce", "bf16+cce"} <= {r.text for r in cfg.rows}
    prepared = prepare_study(cfg)
    assert {"fp16", "tf32", "liger", "bf16+cce"} <= set(prepared.unsupported)
    named = CompareOptions(**{**lm, "strategies": "baseline,fp16"}).resolve()[0]
    with pytest.raises(ConfigError, match="strategy 'fp16' needs cuda"):  # a row the user names: still an error
        prepare_study(named)


def test_a_missing_metric_package_is_said_once_before_any_trial(tmp_path, s2s_csv, monkeypatch):
    """Every prompt/response trial of an H200 study failed, one by one, on `No module named 'rouge_score'`."""
    from tests.conftest import tiny_study
    from trainwise.study import prepare

    monkeypatch.setattr(prepare, "missing_text_metric_packages", lambda: ["rouge-score"])
    with pytest.raises(ConfigError) as e:
        tiny_study(tmp_path / "s", s2s_csv, "seq2seq", ["baseline"])
    assert "rouge-score cannot be imported here: pip install rouge-score, or pass --eval-samples 0" in str(e.value)
    assert not (tmp_path / "s").exists()
    tiny_study(tmp_path / "t", s2s_csv, "seq2seq", ["baseline"], eval_samples=0)  # no evaluation: nothing to score


def test_the_commit_is_trainwises_never_an_enclosing_repos(tmp_path):
    """A study run from another repository recorded that repository's commit: trainwise installed inside a user's
    project (its .venv) found the project's git."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    project = tmp_path / "project"
    site = project / ".venv" / "lib"
    shutil.copytree(Path(__file__).resolve().parents[2] / "trainwise", site / "trainwise")
    env = {"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@y", "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@y"}
    for cmd in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "user's project"]):
        subprocess.run(["git", "-C", str(project), *cmd], check=True, env={**env, "PATH": "/usr/bin:/bin"})
    code = "from trainwise.core.env import git_commit; print(git_commit())"
    done = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "None", done.stdout
    from trainwise.core.env import git_commit

    assert git_commit() is None or len(git_commit().split("-")[0]) == 12  # this checkout's own, when it is one


def test_a_compiling_row_gets_its_compile_past_the_timeout():
    from trainwise.spec.config import TrialSpec
    from trainwise.study.run import COMPILE_ALLOWANCE_S, timeout_for

    plain = strategies.parse_row("bf16", 4).plan
    compiled = strategies.parse_row("bf16+compile", 4).plan
    spec = TrialSpec("bf16", 0, plain, None)  # type: ignore[arg-type]  # the settings are not read
    assert timeout_for(spec, 100.0) == 100.0
    assert timeout_for(dataclasses.replace(spec, plan=compiled), 100.0) == 100.0 + COMPILE_ALLOWANCE_S


def test_a_studys_rows_are_read_per_sample_with_their_two_parts():
    """The H200 study (../shared/measurements/h200-2026-11-27): packing's step took the baseline's 0.25 s with 8x its
    samples, so per sample it is 12%, and its parts (per sample, per step) sum to that; cce ran only as bf16+cce,
    and it is in the pool through that row."""
    import json

    from trainwise.core.results import StudyRow

    data = json.loads((Path(__file__).resolve().parents[1] / "data" / "h200_plan_study.json").read_text())
    rows = [StudyRow.from_dict(r) for r in data["rows"]]
    found = {o.row: o for o in observations(rows, 4, 16, {})}
    packed = found["packing"]
    assert packed.time == pytest.approx(0.123, abs=0.001) and packed.parts is not None
    assert sum(packed.parts) == pytest.approx(packed.time, rel=1e-6)
    assert found["baseline"].time == pytest.approx(1.0) and found["baseline"].weight >= 1
    assert packed.key == Key(plan_of(frozenset({"packing"}), 4), 16)
    sized = [o for o in found.values() if "@bs" in o.row]
    assert sized and all(o.key.batch == split_row(o.row)[1] for o in sized)
    assert "cce" not in {n for o in found.values() if o.ok and len(o.names) == 1 for n in o.names}
    assert ("cce" in pool(list(found.values()))) == any(o.ok and "cce" in o.names for o in found.values())


def test_a_strategy_the_device_only_emulates_stays_out_though_all_ran():
    """An AVX2-only CPU records bf16 as emulated (not trained), while `all` trains without it: bf16 is no candidate."""
    from trainwise.core.results import StudyRow

    def row(text: str, status: str, sps: float | None) -> StudyRow:
        return StudyRow.from_dict(
            {"strategy": text, "status": status, "samples_per_s": sps, "baseline": text == "baseline"}
        )

    rows = [row("baseline", "ok", 10.0), row("bf16", "emulated", None), row("dynamic_pad", "ok", 20.0)]
    found = observations([*rows, row("all", "ok", 12.0)], 4, 16, {})
    assert "bf16" in next(o.names for o in found if o.row == "all")  # (its text names it)
    assert "bf16" not in pool(found) and "dynamic_pad" in pool(found)
    failed = observations(
        [*rows[:2], row("dynamic_pad", "oom", None), row("dynamic_pad+smart_batch", "ok", 30.0)], 4, 16, {}
    )
    assert "dynamic_pad" in pool(failed)  # (out of memory at a size is no verdict on the strategy)
