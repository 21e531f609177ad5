"""`trainwise find-batch` as a call: climb the candidate batch sizes, measure, bisect at the edge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwise.api.options import FindBatchOptions
from trainwise.api.render import STDERR, Render
from trainwise.run import launcher
from trainwise.search.batch_size import FindBatchReport
from trainwise.search.batch_size import find_batch as search
from trainwise.training.job import launch


def start(options: FindBatchOptions, render: Render | None = STDERR) -> FindBatchReport:
    render = Render.of(render)
    fb = options.resolve()
    launcher.warm()  # the trials' process imports while the data is prepared
    from trainwise.study.run import ClusterLaunch  # heavy: trainwise.study.run loads numpy

    # on a cluster: each probe on a node of it (one at a time: each size decides the next)
    run = launch if options.ray_address is None else ClusterLaunch(options.ray_address)
    try:
        with render.status("trainwise find-batch: ...") as status:
            return search(
                options.strategies, options.accum_steps, options.config_at, fb, run, render.update(status), render.line
            )
    finally:
        if isinstance(run, ClusterLaunch):
            run.close()


def find_batch(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> FindBatchReport:
    """`trainwise find-batch` in Python: the CLI's options as keyword arguments (over a study file's)."""
    return start(FindBatchOptions.of(options, config), render)
