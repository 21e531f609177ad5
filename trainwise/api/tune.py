"""`trainwise tune` as a call: search one plan's hyper-parameters (Optuna random / TPE, or Ray PBT)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwise.api.options import TuneOptions
from trainwise.api.render import STDERR, Render
from trainwise.exporting.commands import best_train_command
from trainwise.search.hyperparams import tune as search_space
from trainwise.search.space import TuneResult


def start(options: TuneOptions, render: Render | None = STDERR) -> tuple[TuneResult, dict]:
    """(the search's result, tune_result.json's content)."""

    render = Render.of(render)
    cfg, study = options.resolve()
    with render.status("trainwise tune: ...") as status:
        return search_space(cfg, study, options.price(), render.update(status), render.line, best_train_command)


def tune(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> tuple[TuneResult, dict]:
    """`trainwise tune` in Python: the CLI's options as keyword arguments (over a study file's)."""
    return start(TuneOptions.of(options, config), render)
