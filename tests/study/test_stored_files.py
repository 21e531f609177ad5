"""Issue 35, part 3: `trainwise.study.store` owns every file a study writes and reads, and a study written
before the study package still opens. tests/data/study_e874211 is the --out of a real `trainwise compare`
run by commit e874211 (the last main with study.py whole), quality phase and price included:

    trainwise compare --model-preset bert-tiny --strategies baseline,dynamic_pad --max-steps 4 --warmup-steps 1
      --eval-samples 32 --quality-steps 4 --seeds 2 --max-train-samples 200 --price-per-hour 2.5 --retries 0

(its data/, tokenizer/ and trials/ left out: nothing below reads them)."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest

import trainwise
from trainwise.api.options import CompareOptions
from trainwise.api.stored import advise_study
from trainwise.core.errors import ConfigError
from trainwise.core.quality import QualityVerdicts
from trainwise.search.ranking import Constraints
from trainwise.spec.config import TrialSpec
from trainwise.study import store

OLD = Path(__file__).resolve().parents[1] / "data" / "study_e874211"


def test_a_study_written_by_e874211_opens_typed(tmp_path):
    study = tmp_path / "old"
    shutil.copytree(OLD, study)
    rows = store.read_results(study)
    assert [r.strategy for r in rows] == ["baseline", "dynamic_pad"] and all(r.status == "ok" for r in rows)
    assert rows[0].baseline and rows[0].rel_time == 1.0 and rows[1].rel_time is not None
    assert rows[0].cost_per_epoch is not None, "the study was priced"
    old = json.loads((OLD / "results.json").read_text())["rows"]
    # no key lost, none changed (fields added since, e.g. added_steps, come with their defaults)
    assert len(rows) == len(old) and all(o.items() <= r.to_dict().items() for r, o in zip(rows, old, strict=True))
    settings = store.read_settings(study)
    assert settings["command"].startswith("trainwise compare --out /tmp/old_study") and settings["price"]
    assert store.read_progress(study) == (3, 3) and store.partial_note(study) is None
    assert len(store.read_trial_keys(study) or []) == 3

    verdicts = store.read_quality(study)
    assert isinstance(verdicts, QualityVerdicts) and verdicts.seeds == 2
    assert [q.strategy for q in verdicts.rows][0] == "baseline" and verdicts.rows[0].verdict == "reference"
    assert all(len(q.values) == 2 for q in verdicts.rows), "one metric per seed"

    spec = store.Store.spec_of(study)
    assert isinstance(spec, TrialSpec) and spec.settings.model_ref == "bert-tiny"
    assert {r.row for r in rows} >= {spec.row}
    assert CompareOptions.of({}, study / store.STUDY_FILE).strategies == "baseline,dynamic_pad"


def test_the_old_store_keeps_its_keys_so_a_rerun_resumes():
    """TrialSettings lost max_steps (a compare trial's step count is TrialSpec.steps, train's is its schedule):
    a spec stored before reads back with its steps, and its key is the one it was stored under."""
    import sqlite3

    with sqlite3.connect(OLD / "study.sqlite") as db:
        stored = db.execute("SELECT key, spec FROM trials").fetchall()
    assert len(stored) == 3
    for key, blob in stored:
        spec = TrialSpec.from_dict(json.loads(blob))
        assert spec.steps == 4 and not hasattr(spec.settings, "max_steps")
        assert spec.key() == key and TrialSpec.from_dict(spec.to_dict()) == spec
        assert spec.to_dict()["settings"]["max_steps"] == 4, "where the previous release reads a stored spec's steps"


def test_a_fileless_old_study_says_what_a_run_would_replace(tmp_path):
    """A study from before studies kept study.yaml: its store says its settings, so a compare of other steps
    into it is refused in one line naming them (the steps come from the stored spec, not its settings)."""
    from trainwise.api.compare import over_study

    study = tmp_path / "old"
    shutil.copytree(OLD, study)
    (study / store.STUDY_FILE).unlink()
    asked = CompareOptions.of({"out": str(study), "model_preset": "bert-tiny", "strategies": "baseline,dynamic_pad"})
    with pytest.raises(ConfigError, match="max_steps 4 → 16"):
        over_study(asked)


def test_advise_and_the_python_api_read_the_old_study(tmp_path):
    study = tmp_path / "old"
    shutil.copytree(OLD, study)
    advice = advise_study([study], Constraints())
    assert advice.recommended in ("baseline", "dynamic_pad")
    assert any("quality from the quality phase (4 steps x 2 seeds)" in n for n in advice.notes)
    opened = trainwise.open(study)
    assert opened.settings["model"].startswith("bert-tiny") and len(opened.rows) == 2
    assert opened.advise(objective="cost").recommended in ("baseline", "dynamic_pad")


def test_the_store_refuses_what_is_not_a_study_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"no results.json \(no trial of it has finished\); run `trainwise compare"):
        store.read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"rows": [{"no": "strategy"}]}')
    with pytest.raises(ConfigError, match="not a trainwise results file"):
        store.read_results(tmp_path)
    (tmp_path / "quality").mkdir()
    (tmp_path / "quality" / "quality.json").write_text('{"rows": 3}')
    with pytest.raises(ConfigError, match="not a trainwise quality file"):
        store.read_quality(tmp_path)
    assert store.read_progress(tmp_path) is None and store.Store.spec_of(tmp_path) is None


def test_the_report_is_written_whole_and_reads_back(tmp_path):
    rows = store.read_results(OLD)
    paths = store.write_reports(tmp_path, rows, "t", 1, 2, store.read_settings(OLD), ["k"])
    assert [p.name for p in paths] == ["results.json", "results.csv", "report.md", "chart.png"]
    assert store.read_results(tmp_path) == rows and store.read_trial_keys(tmp_path) == ["k"]
    assert store.partial_note(tmp_path) == (
        f"{tmp_path} is partial: 1 of 2 trials finished (interrupted, or still running); "
        "the same compare command finishes it"
    )
    (tmp_path / "quality").mkdir()  # the quality phase's own study directory
    store.write_quality(tmp_path / "quality", store.read_quality(OLD))  # type: ignore[arg-type]
    assert store.read_quality(tmp_path) == store.read_quality(OLD)


def test_advise_opens_no_file():
    """search/ranking.py (advise's engine) is the pure ranking: no open(), no Path reads, no import of the study's
    files."""
    source = (Path(trainwise.__file__).parent / "search" / "ranking.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "") for n in ast.walk(tree)
             if isinstance(n, ast.Call)}  # fmt: skip
    assert not calls & {"open", "read_text", "read_bytes", "read_json", "is_file", "exists"}
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m and (m.startswith("trainwise.study") or m == "trainwise.core.files") for m in imported)
