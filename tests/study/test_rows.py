"""Issue 25, point 4: a study's rows are StudyRow dataclasses, and results.json keeps its keys. The fixtures in
tests/data/study_rows were written by commit 5c1a55b, when rows were dicts (make_golden.py there says how): a
real tiny study's results.json and a synthetic one with every kind of row, and what that commit made of each.
Today's typed rows must read them, write them back byte for byte, and render and advise on them the same.
golden/*/advise.json was rewritten once since, by issue 36 (a speed trial's quality difference is shown as its
figures, not as a gain or a loss; Verdict's new `quality` and `quality_measured`): only those changed in it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from trainwise.api.quality import candidates
from trainwise.api.stored import advise_study
from trainwise.api.study import Study
from trainwise.core.results import StudyRow
from trainwise.report import terminal
from trainwise.report.write import markdown
from trainwise.search.ranking import Constraints, advise
from trainwise.study.aggregate import Report
from trainwise.study.store import read_results, read_rows, write_reports

DATA = Path(__file__).resolve().parents[1] / "data" / "study_rows"
STUDIES = ["real", "synthetic"]
# the constraints make_golden.py advised under (as advise's options)
CONSTRAINTS = {
    "time": dict(objective="time"),
    "cost": dict(objective="cost"),
    "quality": dict(objective="quality"),
    "budget": dict(memory_budget="1MiB"),
    "some_fit": dict(memory_budget="340MB", objective="cost"),
    "tight": dict(max_quality_drop=0.5, max_epoch_time="30s", max_epoch_cost=0.002),
}


def golden(study: str, name: str) -> str:
    return (DATA / "golden" / study / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("study", STUDIES)
def test_rows_written_before_round_trip_through_the_dataclass(study):
    text = (DATA / study / "results.json").read_text(encoding="utf-8")
    payload = json.loads(text)
    rows = read_results(DATA / study)
    assert all(isinstance(r, StudyRow) and r.extra == {} for r in rows), "every key of today's rows is a field"
    assert [r.to_dict() for r in rows] == payload["rows"]
    assert [list(r.to_dict()) for r in rows] == [list(d) for d in payload["rows"]], "the keys in their order"
    again = json.dumps({"study": payload["study"], "rows": [r.to_dict() for r in rows]}, indent=1, default=str)
    assert again == text


@pytest.mark.parametrize("study", STUDIES)
def test_the_reports_of_typed_rows_are_those_of_the_dicts(study, tmp_path):
    """results.json byte for byte, results.csv and report.md as 5c1a55b wrote them from the same rows."""
    payload = json.loads((DATA / study / "results.json").read_text(encoding="utf-8"))
    rows = read_results(DATA / study)
    write_reports(tmp_path, rows, "trainwise compare: golden", study=payload["study"])
    assert (tmp_path / "results.json").read_text() == (DATA / study / "results.json").read_text()
    assert (tmp_path / "results.csv").read_text() == golden(study, "results.csv")
    assert markdown(rows, "trainwise compare: golden", payload["study"]) == golden(study, "report.md")
    console = Console(record=True, width=240, file=open(tmp_path / "tty", "w"))  # noqa: SIM115
    terminal.compare_table(Report("trainwise compare: golden", rows, [Path("results.json")]), console)
    assert console.export_text() == golden(study, "terminal.txt")


@pytest.mark.parametrize("study", STUDIES)
def test_typed_rows_give_the_same_advice_and_candidates(study):
    """advise and the quality candidates on typed rows are as before."""
    want = json.loads(golden(study, "advise.json"))
    for name, options in CONSTRAINTS.items():
        try:
            got = json.loads(json.dumps(dataclasses.asdict(advise_study(DATA / study, Constraints.of(options)))))
        except Exception as e:  # noqa: BLE001 - the golden holds the refusal when there was one
            got = {"error": f"{type(e).__name__}: {e}"}
        assert got == want[name], name
    assert candidates(read_results(DATA / study)) == json.loads(golden(study, "candidates.json"))


def test_a_bare_list_an_older_row_and_a_newer_key_all_read(tmp_path):
    """The bare list a study wrote before its settings were stored; a row from before most of today's keys
    (their defaults); a key a newer trainwise added (kept, written back, ignored by advise)."""
    rows = read_rows(DATA / "real" / "results.json")
    (tmp_path / "results.json").write_text(json.dumps(rows))
    assert [r.to_dict() for r in read_results(tmp_path)] == rows
    old = {"strategy": "baseline", "status": "ok", "baseline": True, "samples_per_s": 10.0, "peak_mem_bytes": 100}
    newer = {**old, "strategy": "bf16", "baseline": False, "samples_per_s": 20.0, "joules_per_step": 3.5}
    (tmp_path / "results.json").write_text(json.dumps({"study": {}, "rows": [old, newer]}))
    base, bf16 = read_results(tmp_path)
    assert base.row_text == "baseline" and base.batch_size is None and not base.priced and base.metrics is None
    assert bf16.extra == {"joules_per_step": 3.5} and bf16.to_dict()["joules_per_step"] == 3.5
    assert advise([base, bf16], Constraints()).recommended == "bf16"
    assert "joules_per_step" in Study(tmp_path).to_pandas().columns


def test_to_pandas_gives_the_flat_columns_of_results_json(tmp_path):
    import pandas as pd

    shutil.copy(DATA / "synthetic" / "results.json", tmp_path / "results.json")
    study = Study(tmp_path)
    frame = study.to_pandas()
    flat = pd.json_normalize(read_rows(tmp_path / "results.json"))
    assert list(frame.columns) == list(flat.columns) and len(frame) == len(study.rows) == 12
    assert "env.device_name" in frame.columns and list(frame["strategy"])[:2] == ["baseline @bs8", "baseline @bs16"]
    assert study.rows[0].peak_mem_bytes == frame["peak_mem_bytes"][0]
