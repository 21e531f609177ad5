"""The quality phase as a call: the speed study's candidates trained longer, with seeds, and their verdicts
(the statistics are `trainwise.search.verdicts`, the file `trainwise.study.store`)."""

from __future__ import annotations

import dataclasses

from trainwise.core.quality import QualityVerdicts
from trainwise.core.results import StudyRow
from trainwise.search import verdicts as quality
from trainwise.search.ranking import Constraints, advise
from trainwise.spec.config import StudyConfig
from trainwise.study.prepare import prepare_study
from trainwise.study.run import run_study
from trainwise.study.store import write_quality


def candidates(table: list[StudyRow]) -> list[str]:
    """The rows worth a quality verdict: the baseline and the Pareto front of time and memory (their
    short-trial quality left out: it is what this phase replaces), as row texts, in table order."""
    rows = [dataclasses.replace(e, metric=None) for e in table if e.status == "ok"]
    front = {v.strategy for v in advise(rows, Constraints()).verdicts if v.pareto}
    chosen = [e.row_text for e in rows if e.baseline or e.strategy in front]
    return list(dict.fromkeys(chosen))


def run_quality(cfg: StudyConfig, table: list[StudyRow], steps: int, seeds: int, launch, progress, on_table) -> list:
    """Choose the candidates from the speed study's table, run their quality study, write the verdicts."""
    rows = candidates(table)
    if not rows:
        return []
    prepared = prepare_study(quality.quality_config(cfg, rows, steps, seeds))
    quality.equal_samples(prepared)
    with progress(prepared) as (on_event, on_done):
        trials = run_study(prepared, launch, on_event, on_done)
    s = prepared.specs[0].settings
    found = quality.verdicts(trials, s.model_kind == "preset" and s.task != "image-classification")
    write_quality(prepared.out, QualityVerdicts(seeds, found))
    on_table(found, seeds)
    return found
