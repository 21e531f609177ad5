"""`trainwise train --report-to tensorboard,mlflow,wandb` and `compare --report-to wandb`: the curves in the tools
people already use.

Every optimizer step logs `train/loss` and `train/lr`; every evaluation logs `eval/<name>` (the
task metric and the interval's train loss). TensorBoard event files go to `<out>/tensorboard`
(`tensorboard --logdir <out>/tensorboard`). MLflow goes to a file store at `<out>/mlruns`
(`mlflow ui --backend-store-uri <out>/mlruns`), or to `MLFLOW_TRACKING_URI` when that is set (a
server, or `sqlite:///...`, the store MLflow 3 now recommends). The run's settings are logged as
parameters and its result as summary metrics. A resumed run appends to the same curves: TensorBoard
by step (the steps after the checkpoint that a killed session had logged are purged), MLflow in the
run whose id the first session stored in `<out>/mlflow_run_id`.

Weights & Biases logs to its project `trainwise` (or WANDB_PROJECT), its files under `<out>/wandb`; with
WANDB_MODE=offline it needs no network or login (`wandb sync <out>/wandb/offline-run-*` uploads later). A run
resumed with --resume continues the run whose id is in `<out>/wandb_run_id` (offline: a second folder with that
id); W&B opens its run at the first step, and a failure of W&B's is a warning, never the end of the training.
A compare study (`log_trials`) is one W&B run per trial, grouped by the study: config the trial's settings and
plan, history its loss at every step, summary its measurements; and, once the study ends, one run more with the
table as a W&B Table.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwise.core.errors import ConfigError
from trainwise.core.files import write_atomic
from trainwise.run.events import Eval, Event, Step

# name -> (module to import, package, extra)
BACKENDS = {
    "tensorboard": ("tensorboard", "tensorboard", "report"),
    "mlflow": ("mlflow", "mlflow-skinny", "report"),
    "wandb": ("wandb", "wandb", "wandb"),
}
WANDB_LOCAL = ("offline", "disabled", "dryrun")  # WANDB_MODEs that need no login


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
        if name == "wandb":
            check_wandb_login()
    return tuple(dict.fromkeys(names))


def compare_report_to(value: str | None) -> tuple[str, ...]:
    """compare's `--report-to`: W&B only (a run per trial); TensorBoard and MLflow follow a training run (train)."""
    names = parse_report_to(value)
    if others := [n for n in names if n != "wandb"]:
        raise ConfigError(
            f"compare --report-to takes wandb (a W&B run per trial), not {', '.join(others)}: "
            "train --report-to logs a training run's curves there"
        )
    return names


def check_wandb_login() -> None:
    """One line now, not a prompt or a failure after the run: online W&B needs a login. Refused only where none
    can be found: no WANDB_API_KEY or WANDB_IDENTITY_TOKEN_FILE, no key or offline mode in W&B's settings file
    (`wandb login`, `wandb offline`), no W&B machine in the netrc file `wandb login` writes."""
    if os.environ.get("WANDB_MODE", "").lower() in WANDB_LOCAL:
        return
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR", Path.home() / ".config" / "wandb")).expanduser()
    settings = config_dir / "settings"
    said = settings.read_text(errors="replace") if settings.is_file() else ""
    if "api_key" in said or any(f"mode = {m}" in said for m in WANDB_LOCAL):
        return
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc")).expanduser()
    host = os.environ.get("WANDB_BASE_URL", "api.wandb.ai").split("://")[-1].split("/")[0]
    text = netrc.read_text(errors="replace") if netrc.is_file() else ""
    if host in text or "wandb" in text:
        return
    raise ConfigError(
        "--report-to wandb: no W&B login here: run `wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline "
        "to keep the runs in the output folder's wandb/ and `wandb sync` them later"
    )


def _wandb_init(out: Path, name: str, config: dict, live: bool = False, **kw: Any) -> Any:
    """A W&B run in `out`/wandb. `live`: a training run, with W&B's system metrics and its lines on stderr; else a
    run logged after the fact (a compare trial), silent and without them (six lines per trial otherwise)."""
    import wandb  # optional: trainwise[wandb]

    project = os.environ.get("WANDB_PROJECT", "trainwise")
    settings = (
        wandb.Settings(console="off", quiet=True)
        if live
        else wandb.Settings(console="off", silent=True, x_disable_stats=True)
    )
    return wandb.init(
        project=project, dir=str(out), name=name, config=config, reinit="create_new", settings=settings, **kw
    )


class Tracker:
    """Forwards run_train's events to the chosen backends. W&B's run opens at the first step (a run stopped by a
    check of its input opens none), continues the run in `wandb_run_id` only when `resume` (a new run in a reused
    --out is a new W&B run), and a W&B failure is a warning through `warn`: it never stops the training."""

    def __init__(
        self,
        names: tuple[str, ...],
        out: Path,
        run_name: str,
        params: dict,
        resume: bool = False,
        warn: Callable[[str], None] = lambda _text: None,
    ) -> None:
        self.tb: Any = None  # torch.utils.tensorboard.SummaryWriter, opened at the first step
        self.mlflow: Any = None  # mlflow.tracking.MlflowClient
        self.wandb: Any = None  # wandb.Run, opened at the first step
        self.run_id = ""
        self.tb_dir = out / "tensorboard" if "tensorboard" in names else None
        self.params = params
        self.out, self.run_name, self.resume, self.warn = out, run_name, resume, warn
        self.wandb_wanted = "wandb" in names
        if "mlflow" in names:
            self._start_mlflow(out, run_name, params)

    def _wandb(self, do: Callable[[Any], object]) -> None:
        """`do(run)` on the W&B run (opened first if need be); a failure is said once and W&B is left alone."""
        if not self.wandb_wanted:
            return
        try:
            if self.wandb is None:
                marker = self.out / "wandb_run_id"
                resumed = marker.read_text().strip() if self.resume and marker.is_file() else None
                kw = {"id": resumed, "resume": "allow"} if resumed else {}
                self.wandb = _wandb_init(self.out, self.run_name, self.params, live=True, job_type="train", **kw)
                write_atomic(marker, self.wandb.id)
            do(self.wandb)
        except Exception as e:  # noqa: BLE001  (wandb's own: a service that did not start, a network gone)
            self.wandb_wanted = False
            self.warn(f"--report-to wandb: {type(e).__name__}: {e}; the run goes on without W&B")

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
        self._wandb(lambda run: run.log(values, step=step))
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
        if self.wandb is not None:  # opened: it had a step

            def end(run: Any) -> None:
                if summary:
                    run.summary.update({k: v for k, v in summary.items() if v is not None})
                run.finish(exit_code=1 if failed else 0)

            self._wandb(end)


# ---- compare: one W&B run per trial -------------------------------------------------------------------------

LOGGED = "wandb_logged.json"  # the trials (key and status) a study has logged to W&B, and whether its table
SUMMARY = (
    "status", "message", "step_time_s", "samples_per_s", "tokens_per_s", "epoch_time_s", "peak_mem_bytes",
    "peak_rss_bytes", "state_bytes", "mfu", "train_loss", "final_loss", "metric_name", "metric", "padding_waste",
    "contended", "discarded_runs", "wall_s", "world_size",
)  # fmt: skip


def group_of(out: Path) -> str:
    """A study's W&B group: the name of its folder."""
    return out.resolve().name or str(out.resolve())


def _logged(out: Path) -> set[str]:
    marker = out / LOGGED
    return set(json.loads(marker.read_text())) if marker.is_file() else set()


def log_trials(out: Path, trials: list) -> int:
    """Each (spec, result) not logged yet (a trial run again, as by --retry-failed, is logged again: its status is
    part of what was logged), as a W&B run of the study's group: its settings and plan as config, its loss at every
    step as history, its measurements as summary. Returns how many runs it logged."""
    done = _logged(out)
    logged = 0
    for spec, result in trials:
        key = f"{spec.key()} {result.status}"
        if key in done:
            continue
        config = {"row": spec.row, "repeat": spec.repeat, "steps": spec.steps, **dataclasses.asdict(spec.settings)}
        config |= {f"plan.{k}": v for k, v in spec.plan.to_dict().items()}
        workers = spec.settings.num_workers
        name = f"{spec.row} #{spec.repeat} bs{spec.settings.batch_size}" + (f" w{workers}" if workers else "")
        run = _wandb_init(out, name, config, group=group_of(out), job_type="trial")
        for step, loss in enumerate(result.losses or [], 1):
            run.log({"train/loss": loss}, step=step)
        run.summary.update({k: getattr(result, k) for k in SUMMARY if getattr(result, k, None) is not None})
        run.finish(exit_code=0 if result.status == "ok" else 1)
        done.add(key)
        write_atomic(out / LOGGED, json.dumps(sorted(done)))
        logged += 1
    return logged


def log_table(out: Path, headers: list[str], rows: list[list[str]], changed: bool) -> bool:
    """The study's table, as the report shows it, as a W&B Table in a run of the study's group: when trials were
    logged since the last one (`changed`), or none was logged yet. Returns whether it logged one."""
    import wandb  # optional: trainwise[wandb]

    done = _logged(out)
    if not changed and "table" in done:
        return False
    study = group_of(out)
    run = _wandb_init(out, f"{study}: the table", {"study": study}, group=study, job_type="study")
    run.log({"table": wandb.Table(columns=list[str | int](headers), data=rows)})
    run.finish()
    write_atomic(out / LOGGED, json.dumps(sorted(done | {"table"})))
    return True
