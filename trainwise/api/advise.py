"""`trainwise advise` as a call: --run runs (or resumes) the study first, as compare; then the advice on
the studies on disk (`api/studies.py`), and which of them are partial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwise.api import compare
from trainwise.api.options import AdviseOptions
from trainwise.api.render import STDERR, Render, probes
from trainwise.api.stored import advise_study
from trainwise.search.ranking import Advice
from trainwise.study.store import partial_note


def start(options: AdviseOptions, render: Render | None = STDERR) -> Advice:
    """--run: run (or resume) the study first, as compare; then advise on the studies, and say which are
    partial (killed, or still running)."""
    render = Render.of(render)
    paths = options.paths()
    constraints = options.constraints()
    if options.run:
        compare.start(options.compare_options(), render)
    with render.status("advising (a budget adds batch hints: an estimate, a probe on first use)...") as status:
        what = "advising: the batch hints' memory estimate is calibrating (once: then cached)"
        result = advise_study(paths, constraints, probes(render.update(status), what))
    for partial in filter(None, map(partial_note, paths)):
        render.note(f"trainwise: note: {partial}")
    return result


def advise(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> Advice:
    """`trainwise advise` in Python: `study=[paths]` and the CLI's options as keyword arguments (over a
    study file's). Returns the Advice (`recommended`, `verdicts` with their reasons, `notes`)."""
    return start(AdviseOptions.of(options, config), render)
