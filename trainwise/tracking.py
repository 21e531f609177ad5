"""`trainwise train --report-to tensorboard,mlflow`: the run's curves in the tools people already use.

Every optimizer step logs `train/loss` and `train/lr`; every evaluation logs `eval/<name>` (the
task metric and the interval's train loss). TensorBoard event files go to `<out>/tensorboard`
(`tensorboard --logdir <out>/tensorboard`). MLflow goes to a file store at `<out>/mlruns`
(`mlflow ui --backend-store-uri <out>/mlruns`), or to `MLFLOW_TRACKING_URI` when that is set (a
server, or `sqlite:///...`, the store MLflow 3 now recommends). The run's settings are logged as
parameters and its result as summary metrics. A resumed run appends to the same curves: TensorBoard
by step (the steps after the checkpoint that a killed session had logged are purged), MLflow in the
run whose id the first session stored in `<out>/mlflow_run_id`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from trainwise.errors import ConfigError
from trainwise.events import Eval, Event, Step

# name -> (module to import, package, extra)
BACKENDS = {
    "tensorboard": ("tensorboard", "tensorboard", "report"),
    "mlflow": ("mlflow", "mlflow-skinny", "report"),
}


def parse_report_to(value: str | None) -> tuple[str, ...]:
    """Validate `--report-to` (a comma list; `none` or empty for nothing); the packages must import."""
    if value is None:
        return ()
    names = tuple(n.strip() for n in value.split(",") if n.strip() and n.strip() != "none")
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(f"--report-to: unknown {name!r}; choose from {', '.join(BACKENDS)} (comma-separated)")
        module, package, extra = BACKENDS[name]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"--report-to {name} needs {package}: pip install 'trainwise[{extra}]'")
    return tuple(dict.fromkeys(names))


class Tracker:
    """Forwards run_train's events to the chosen backends."""

    def __init__(self, names: tuple[str, ...], out: Path, run_name: str, params: dict) -> None:
        self.tb: Any = None  # torch.utils.tensorboard.SummaryWriter, opened at the first step
        self.mlflow: Any = None  # mlflow.tracking.MlflowClient
        self.run_id = ""
        self.tb_dir = out / "tensorboard" if "tensorboard" in names else None
        self.params = params
        if "mlflow" in names:
            self._start_mlflow(out, run_name, params)

    def _start_mlflow(self, out: Path, run_name: str, params: dict) -> None:
        from mlflow.entities import Param  # optional: trainwise[report] (mlflow)
        from mlflow.tracking import MlflowClient  # optional: trainwise[report] (mlflow)

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # the file store the user asked for: MLflow 3 keeps it in maintenance mode behind this switch
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (out / "mlruns").resolve().as_uri()
        self.mlflow = MlflowClient(tracking_uri=uri)
        marker = out / "mlflow_run_id"
        if marker.is_file():  # a resumed run continues its MLflow run
            self.run_id = marker.read_text().strip()
            self.mlflow.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.mlflow.get_experiment_by_name("trainwise")
        exp_id = experiment.experiment_id if experiment else self.mlflow.create_experiment("trainwise")
        self.run_id = self.mlflow.create_run(exp_id, run_name=run_name).info.run_id
        marker.write_text(self.run_id)
        values = [Param(k, str(v)[:500]) for k, v in sorted(params.items())]
        self.mlflow.log_batch(self.run_id, params=values)

    def log(self, event: Event) -> None:
        if isinstance(event, Step):
            lr = {} if event.lr is None else {"train/lr": event.lr}
            self._scalars({"train/loss": event.loss, **lr}, event.step)
        elif isinstance(event, Eval):
            values = {f"eval/{k}": v for k, v in event.values.items() if k != "best"}
            self._scalars({k: float(v) for k, v in values.items() if isinstance(v, int | float)}, event.step)

    def _scalars(self, values: dict[str, float], step: int) -> None:
        if self.tb is None and self.tb_dir is not None:
            from torch.utils.tensorboard import SummaryWriter  # optional: trainwise[report] (tensorboard)

            # a resumed run starts after its checkpoint: drop what the killed session logged from there on
            self.tb = SummaryWriter(str(self.tb_dir), purge_step=step if step > 1 else None)
            self.tb.add_text("params", "\n".join(f"    {k}: {v}" for k, v in sorted(self.params.items())))
        if self.tb is not None:
            for key, value in values.items():
                self.tb.add_scalar(key, value, step)
        if self.mlflow is not None:
            from mlflow.entities import Metric  # optional: trainwise[report] (mlflow)

            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, step) for k, v in values.items()]
            self.mlflow.log_batch(self.run_id, metrics=metrics)

    def close(self, summary: dict | None = None, failed: bool = False) -> None:
        """Flush; with the run's summary (steps, best value, wall time...) as final metrics."""
        if self.tb is not None:
            if summary:
                self.tb.add_text("result", json.dumps(summary, indent=1))
            self.tb.close()
        if self.mlflow is not None:
            if summary:
                numbers = {k: float(v) for k, v in summary.items() if isinstance(v, int | float) and v == v}
                for key, value in numbers.items():
                    self.mlflow.log_metric(self.run_id, f"result_{key}", value)
            self.mlflow.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
