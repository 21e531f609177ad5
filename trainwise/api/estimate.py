"""`trainwise estimate` as a call: each plan's peak training memory, predicted without training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwise.api.options import EstimateOptions
from trainwise.api.render import STDERR, Render
from trainwise.estimate import EstimateReport, run_estimate


def start(options: EstimateOptions, render: Render | None = STDERR) -> EstimateReport:
    render = Render.of(render)
    cfg = options.resolve()
    with render.status("calibrating...") as status:
        return run_estimate(options.model, options.model_preset, cfg, render.update(status))


def estimate(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> EstimateReport:
    """`trainwise estimate` in Python: the CLI's options as keyword arguments (over a study file's).
    Returns the report (`.rows`, `.to_json()`)."""
    return start(EstimateOptions.of(options, config), render)
