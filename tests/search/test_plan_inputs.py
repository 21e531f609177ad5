"""What `trainwise plan` measures beside the user's rows (issue 53): the ecosystem's default read from the installed
TRL / transformers, each task's own default rows (recorded 'unsupported' where the device lacks them, also with an
explicit --device), a strategy that runs only beside another (cce), the batch search past an out-of-memory size, a
missing metric package said once, and the commit a study records."""

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
from trainwise.search.policy import Measured, search, split_row

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
    assert found.fields["grad_ckpt"] == "gradient_checkpointing=True" and "learning rate" in found.notes[0]
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
    refuse = ecosystem._build(
        "causal-lm",
        "cpu",
        {"bf16": True, "optim": "adamw_torch"},
        "x",
        lambda row: "no" if "bf16" in row else None,
        True,
    )
    assert "bf16" not in refuse.row and any(n.startswith("bf16: left out") for n in refuse.notes)
    packed = ecosystem._build("causal-lm", "cpu", {"packing": True, "optim": "adamw_torch"}, "x", lambda _r: None, True)
    assert "packing" in packed.row and "dynamic_pad" not in packed.row


def test_a_pick_is_no_slower_than_the_default_and_simplest():
    """A pick is never slower than the ecosystem default, and is the simplest within the floor."""
    singles = [
        Measured("baseline", frozenset(), 1.0, 1.0),
        Measured("bf16", frozenset({"bf16"}), 0.6, 1.0),
        Measured("dynamic_pad", frozenset({"dynamic_pad"}), 0.7, 1.0),
        Measured("bf16+dynamic_pad+adamw_fused", frozenset({"bf16", "dynamic_pad", "adamw_fused"}), 0.40, 1.0),
    ]
    asked: list[str] = []

    def measure(rows):  # the pair is 2% slower than the default: within the floor, yet the default wins
        asked.extend(rows)
        return [Measured(r, split_row(r)[0], 0.408, 1.0) for r in rows]

    found = search(singles, measure, lambda _n: None, ORDER, noise=0.05, default="bf16+dynamic_pad+adamw_fused")
    assert "bf16+dynamic_pad" in asked
    assert found.incumbent == "bf16+dynamic_pad+adamw_fused"  # the pair has fewer strategies, but is slower
    again = search(singles, measure, lambda _n: None, ORDER, noise=0.05)  # no default: the simpler pair
    assert again.incumbent == "bf16+dynamic_pad"


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


def test_cce_is_read_off_bf16_cce_and_never_picked_alone():
    """cce is read off bf16+cce as a single the search combines and never picks."""
    from trainwise.api.plan import _derived

    parts = (0.0, 0.8, 0.1, 0.1)
    table = [
        Measured("baseline", frozenset(), 1.0, 1.0, parts=parts),
        Measured("bf16", frozenset({"bf16"}), 0.5, 0.8, parts=(0.0, 0.4, 0.05, 0.05)),
        Measured("bf16+cce", frozenset({"bf16", "cce"}), 0.4, 0.5, parts=(0.0, 0.3, 0.05, 0.05)),
    ]
    singles = [m for m in table if len(m.names) <= 1]
    [cce] = _derived(table, singles)
    assert cce.row == "cce" and cce.derived and not cce.feasible
    assert cce.rel_time == pytest.approx(0.8) and cce.rel_mem == pytest.approx(0.625)
    assert cce.parts == pytest.approx((0.0, 0.6, 0.1, 0.1))


def test_an_oom_batch_is_retried_with_each_memory_saver():
    """packing@bs128 ran out of memory on an H200; chunked_ce (less loss memory) would have let it fit. The batch
    search does not stop at the first OOM: the incumbent at that size with a memory saver is measured."""
    singles = [
        Measured("baseline", frozenset(), 1.0, 1.0),
        Measured("packing", frozenset({"packing"}), 0.12, 1.0),
        Measured("chunked_ce", frozenset({"chunked_ce"}), 0.98, 0.6),
        Measured("packing@bs32", frozenset({"packing"}), 0.10, 2.0, batch=32),
    ]
    asked: list[str] = []

    def measure(rows):
        asked.extend(rows)
        out = []
        for r in rows:
            names, batch = split_row(r)
            if batch == 64 and "chunked_ce" not in names:
                out.append(Measured(r, names, None, None, status="oom", batch=batch))
            else:
                out.append(Measured(r, names, 0.09 if batch == 64 else 0.118, 1.0, batch=batch))
        return out

    def savers(names):
        return [n for n in ("chunked_ce",) if n not in names]

    sizes = {None: 32, 32: 64, 64: None}
    found = search(singles, measure, lambda _n: None, ORDER, noise=0.02, next_batch=sizes.get, savers=savers)
    assert "packing@bs64" in asked and "packing+chunked_ce@bs64" in asked, asked
    assert asked.index("packing+chunked_ce@bs64") > asked.index("packing@bs64")
    assert found.incumbent == "packing+chunked_ce@bs64"


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
    code = "from trainwise.training.measure.env import git_commit; print(git_commit())"
    done = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "None", done.stdout
    from trainwise.training.measure.env import git_commit

    assert git_commit() is None or len(git_commit().split("-")[0]) == 12  # this checkout's own, when it is one


def test_a_compiling_row_gets_its_compile_past_the_timeout():
    from trainwise.core.config import TrialSpec
    from trainwise.study.run import COMPILE_ALLOWANCE_S, timeout_for

    plain = strategies.parse_row("bf16", 4).plan
    compiled = strategies.parse_row("bf16+compile", 4).plan
    spec = TrialSpec("bf16", 0, plain, None)  # type: ignore[arg-type]  # the settings are not read
    assert timeout_for(spec, 100.0) == 100.0
    assert timeout_for(dataclasses.replace(spec, plan=compiled), 100.0) == 100.0 + COMPILE_ALLOWANCE_S


def test_the_incumbent_tries_the_largest_fitting_batch_once():
    """On a GPU memory, not a doubling at a time, bounds the batch: where the estimate says a batch past the next
    doubling fits, the incumbent is tried there once (packing@bs128 ran out of memory on an H200 while @bs64 fit)."""
    singles = [
        Measured("baseline", frozenset(), 1.0, 1.0),
        Measured("packing", frozenset({"packing"}), 0.12, 1.0),
        Measured("bf16", frozenset({"bf16"}), 0.5, 0.8),
    ]
    asked: list[str] = []

    def measure(rows):
        asked.extend(rows)
        return [
            Measured(r, split_row(r)[0], 0.05 if split_row(r)[1] else 0.06, 1.0, batch=split_row(r)[1]) for r in rows
        ]

    def largest(names, batch):
        return 128 if (batch or 16) < 128 else None

    found = search(
        singles, measure, lambda _n: None, ORDER, noise=0.02, next_batch=lambda b: 2 * (b or 16), largest=largest
    )
    assert asked[0] == "bf16+packing" and "bf16+packing@bs128" in asked[1:3], asked
    assert sum(r.endswith("@bs128") for r in asked) == 1  # once per combination
    assert split_row(found.incumbent)[1] is not None


def test_a_strategy_refused_alone_joins_with_its_companion():
    """cce's effect read off bf16+cce can sort before bf16: refused first (it runs only beside a 16-bit precision),
    taken once bf16 is in; a conflict stays out."""
    from trainwise.search.policy import greedy

    def valid(names):
        try:
            strategies.parse_rows(["+".join(sorted(names, key=ORDER.index))], 4)
        except ConfigError as e:
            return str(e)
        return None

    assert greedy(["cce", "bf16", "packing", "liger"], valid) == frozenset({"cce", "bf16", "packing"})


def test_a_resumed_search_with_a_measured_stack_still_doubles():
    """The greedy stack measured by an earlier run is not forced again, so it does not hold back the doubling."""
    from trainwise.search.policy import Candidate

    singles = [
        Measured("baseline", frozenset(), 1.0, 1.0),
        Measured("bf16", frozenset({"bf16"}), 0.5, 1.0),
        Measured("packing", frozenset({"packing"}), 0.2, 1.0),
        Measured("bf16+packing", frozenset({"bf16", "packing"}), 0.1, 1.0),
    ]
    done = [Candidate("bf16+packing", 1, "the greedy stack", 0.1, state="measured", measured_time=0.1, trial=1)]
    asked: list[str] = []

    def measure(rows):
        asked.extend(rows)
        return [Measured(r, split_row(r)[0], 0.08, 1.0, batch=split_row(r)[1]) for r in rows]

    search(singles, measure, lambda _n: None, ORDER, noise=0.02, earlier=done, next_batch=lambda b: None if b else 32)
    assert asked[:1] == ["bf16+packing@bs32"], asked


def test_a_quality_check_that_gave_no_verdict_rejects_its_row():
    """A check whose longer run finished no trial (or one seed) says nothing of quality: the row is not recommended on
    it, and the next-fastest is checked instead."""
    from trainwise.api.plan import rejection

    assert rejection("bf16@bs64", None, None) == "bf16@bs64's quality check gave no verdict (no trial finished)"
    one = {"verdict": "one seed: no verdict", "values": [50.0], "delta": None}
    assert "one seed: no verdict" in rejection("bf16", one, None)
    fine = {"verdict": "no significant difference", "values": [50.0, 51.0], "delta": -0.5}
    assert rejection("bf16", fine, None) is None
