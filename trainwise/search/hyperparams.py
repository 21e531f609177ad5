"""trainwise tune: hyper-parameter search over `trainwise train` runs (Optuna random search or TPE;
population-based training with Ray Tune is in trainwise.search.pbt).

Each trial is one training run with the sampled values in its own process (a `TuneTrial` job run by
`launcher.run`), reporting its evaluations as events and its outcome as a `TuneTrialResult`; the parent feeds them to
Optuna, which prunes a trial whose intermediate metric falls below the median of earlier trials at
the same step (the process is then killed). The study lives in Optuna's embedded SQLite storage
(`--out/tune.sqlite`): re-running the same command continues it until `--trials` trials have
finished. The result: the best configuration, every trial, and the best-so-far metric against the
optimizer steps spent (the compute), so that two searches on the same budget can be compared.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwise.core.config import TrainConfig, check_monitor, maximize, monitored
from trainwise.core.errors import ConfigError, RunFailed, check_number
from trainwise.core.files import failed, hold, refused_by, write_atomic
from trainwise.core.option import option, take
from trainwise.core.results import TuneTrialResult
from trainwise.report.progress import TrainLine
from trainwise.run import cluster
from trainwise.run.events import Emit, Eval, Event, Step, Warn
from trainwise.run.faults import seamed
from trainwise.run.launcher import Exit, Place, run, warm
from trainwise.search.pbt import EXPERIMENT, check_pbt, run_pbt
from trainwise.search.space import (
    Param,
    TuneResult,
    apply,
    check_search,
    check_task,
    load_space,
    sample,
)
from trainwise.spec.config import StudyConfig, TrialSpec
from trainwise.study.origin import DataOrigin


def make_sampler(search: str, seed: int, n_trials: int):
    import optuna  # optional: trainwise[tune] (optuna)

    if search == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # Optuna's TPE samples its first 10 trials at random, which for a study of <= 10 trials is random
    # search (with the same seed, the very same trials): here a quarter of the budget, 2 to 10
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(2, min(10, n_trials // 4)))


def run_tune(
    spec: TrialSpec,
    space: list[Param],
    search: str,
    n_trials: int,
    out: Path,
    train_args: dict,
    on_trial: Callable[[dict], None],
    seed: int,
    trial_timeout: float,  # --trial-timeout: declared once, on TuneConfig
    on_step: Callable[[int, Step], None] | None = None,  # (trial number, its step): the progress line
    ray_address: str | None = None,  # trials on a Ray cluster, as many at once as it has slots
) -> TuneResult:
    if search not in ("random", "tpe"):
        raise ValueError(f"run_tune runs Optuna's random or tpe, not {search!r} (pbt: trainwise.search.pbt)")
    try:
        import optuna  # optional: trainwise[tune] (optuna)
    except ImportError:
        raise ConfigError("trainwise tune needs optuna: pip install 'trainwise[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler(search, seed, n_trials)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    out.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name=f"trainwise-{search}",
        storage=f"sqlite:///{out / 'tune.sqlite'}",
        sampler=sampler,
        pruner=pruner,
        direction="maximize" if maximize(train_args["monitor"]) else "minimize",
        load_if_exists=True,
    )
    for killed in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        # a trial of a tune run that was killed (SIGKILL, a lost machine): this run holds --out, so it is
        # not running anywhere; it failed, and says why
        study._storage.set_trial_user_attr(killed._trial_id, "error", "interrupted: its tune run was killed")
        study.tell(killed.number, state=optuna.trial.TrialState.FAIL)
    # a trial the disk refused is no measurement: it does not count towards --trials
    done = lambda: [t for t in study.trials if t.state.is_finished() and "refused" not in t.user_attrs]  # noqa: E731
    lock = threading.Lock()  # the study's asks and tells, one thread at a time (trials on a cluster run side by side)
    on_cluster: tuple[cluster.Pool, Any] | None = None

    def one() -> None:
        with lock:
            trial = study.ask()
            values = sample(trial, space)
        started = time.perf_counter()
        trial_dir = out / "trials" / f"{trial.number:04d}"
        stepped = None if on_step is None else (lambda e, n=trial.number: on_step(n, e))
        r = _run_one(apply(spec, values), train_args, trial_dir, trial, trial_timeout, stepped, on_cluster)
        state, value, steps = r.state, r.value, r.steps
        with lock:
            trial.set_user_attr("steps", steps)
            trial.set_user_attr("wall_s", time.perf_counter() - started)
            if state == "complete":
                study.tell(trial, value)
            elif state == "pruned":
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                trial.set_user_attr("error", r.error)
                refused = None if state == "timeout" else refused_by(r.error, trial_dir, died=True)
                if refused:
                    trial.set_user_attr("refused", refused)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                if refused:
                    hint = "make room and run the same command again: finished trials are kept"
                    raise failed(trial_dir, refused, hint)
            on_trial({"number": trial.number, "state": state, "value": value, "params": values, "steps": steps})

    if ray_address is None:
        while len(done()) < n_trials:
            one()
        return _summarise(study)
    pool = cluster.Pool(ray_address, spec.settings.device)
    try:
        on_cluster = (pool, cluster.study_files(pool.ray, spec))
        with ThreadPoolExecutor(len(pool.slots)) as threads:
            running: set = set()
            try:
                while len(done()) + len(running) < n_trials or running:
                    while len(running) < len(pool.slots) and len(done()) + len(running) < n_trials:
                        running.add(threads.submit(one))
                    finished, running = wait(running, return_when=FIRST_COMPLETED)
                    for f in finished:
                        f.result()  # a refused disk, or no node left, stops the search
            except BaseException:  # Ctrl-C too: the trials still running are cancelled, not waited for
                pool.stop()
                raise
    finally:
        pool.close()
    return _summarise(study)


def _summarise(study) -> TuneResult:
    import optuna  # optional: trainwise[tune] (optuna)

    finished = [t for t in study.trials if t.state.is_finished()]
    rows, curve, spent, best, machine_s = [], [], 0, None, 0.0
    higher = study.direction == optuna.study.StudyDirection.MAXIMIZE
    for t in sorted(finished, key=lambda t: t.number):
        steps = int(t.user_attrs.get("steps", 0))
        spent += steps
        machine_s += float(t.user_attrs.get("wall_s", 0.0))
        complete = t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
        if complete and (best is None or (t.value > best if higher else t.value < best)):
            best = t.value
        row = {"number": t.number, "state": t.state.name.lower(), "value": t.value, "params": t.params, "steps": steps}
        said = {k: t.user_attrs[k] for k in ("error", "node") if k in t.user_attrs}  # node: on a cluster, where it ran
        rows.append({**row, **said})
        if best is not None:
            curve.append((spent, best))
    complete = [t for t in finished if t.state == optuna.trial.TrialState.COMPLETE]
    return TuneResult(
        best_value=study.best_value if complete else None,
        best_params=study.best_params if complete else {},
        trials=rows,
        curve=curve,
        machine_s=machine_s,
    )


def best_of(values: list[float | None], monitor: str) -> float | None:
    """The best finite value of the monitored metric, None when there is none."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if maximize(monitor) else min(finite)


@dataclass(frozen=True)
class TuneTrial:
    """One trial of a random / tpe search: a training run with the sampled values (in the spec), for the
    search's budget (tc), in `trial_dir`. It reports its evaluations (the pruner reads them) and ends with a
    TuneTrialResult: its best value and its steps."""

    spec: TrialSpec
    tc: TrainConfig
    trial_dir: Path

    def place(self) -> Place:
        return Place(self.trial_dir / "job.json", self.trial_dir / "stderr.log", None, self.spec.settings.device)

    def to_dict(self) -> dict:
        return {"spec": self.spec.to_dict(), "train": dataclasses.asdict(self.tc), "trial_dir": str(self.trial_dir)}

    @classmethod
    def from_dict(cls, blob: dict) -> TuneTrial:
        return cls(TrialSpec.from_dict(blob["spec"]), TrainConfig(**blob["train"]), Path(blob["trial_dir"]))

    def run(self, emit: Emit) -> TuneTrialResult:
        """Train with the sampled settings; only the evaluations go back (warnings to the trial's log)."""
        # heavy: trainwise.training.fit loads torch and transformers
        from trainwise.training.fit import (
            TrainJob,
            run_train,
        )

        def evals(event: Event) -> None:
            if isinstance(event, Eval | Step):  # the steps: the parent's progress line
                emit(event)
            elif isinstance(event, Warn):
                print(event.text, file=sys.stderr)

        number = int(self.trial_dir.name) if self.trial_dir.name.isdigit() else -1
        r = run_train(TrainJob(self.spec, self.tc, self.trial_dir), seamed(evals, f"tune#{number}", 0))
        value = best_of([monitored(e, self.tc.monitor) for e in r.evals], self.tc.monitor)
        if value is None:
            return TuneTrialResult("fail", None, r.steps, "no evaluation gave a value")
        return TuneTrialResult("complete", value, r.steps)

    def on_node(self, root: Path) -> TuneTrial:
        """This trial on a node of a cluster: the study's files unpacked at `root`, its directory beside them."""
        trial_dir = root.parent / f"tune-{os.getpid()}" / self.trial_dir.name
        return dataclasses.replace(self, spec=cluster.on_this_node(self.spec, root), trial_dir=trial_dir)

    def ended(self, results: list[TuneTrialResult | None], end: Exit) -> TuneTrialResult:
        """complete (its result), pruned (stopped here), timeout, or fail with the log's last line."""
        if end.stopped:
            return TuneTrialResult("pruned")
        if end.timed_out:
            return TuneTrialResult("timeout", error=f"no result within --trial-timeout {end.timeout_s:g}s; killed")
        r = results[0]
        if end.code == 0 and r is not None and r.state in ("complete", "fail"):  # its own word on a failed run
            return r
        return TuneTrialResult("fail", error=end.tail[:300] or "it exited without a word")


def _run_one(
    spec: TrialSpec,
    train_args: dict,
    trial_dir: Path,
    trial,
    timeout_s: float,
    on_step: Callable[[Step], None] | None = None,
    on_cluster: tuple[cluster.Pool, Any] | None = None,
) -> TuneTrialResult:
    """One training run in its own process; its evaluations are reported to Optuna as they come, and a run
    Optuna prunes is killed (with whatever it started), as is one that outlives `timeout_s`. A trial that
    did not complete keeps the best value and the steps its evaluations reported."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(trial_dir / "spec.json", json.dumps({"spec": spec.to_dict(), "train": train_args}))
    monitor = train_args["monitor"]
    value: float | None = None
    steps = 0

    def on_event(event: Event) -> bool:
        """True: Optuna prunes the trial, stop it."""
        nonlocal value, steps
        if isinstance(event, Step) and on_step is not None:
            on_step(event)
        if isinstance(event, Eval):
            steps = event.step
            v = monitored(event.record, monitor)
            if v is not None and math.isfinite(v):
                value = best_of([value, v], monitor)
                trial.report(v, steps)
                return trial.should_prune()
        return False

    job = TuneTrial(spec, TrainConfig(**train_args), trial_dir)
    if on_cluster is None:
        r = run(job, on_event, timeout_s=timeout_s)
    else:
        pool, files = on_cluster
        got = pool.call(job, files, on_event, timeout_s, lambda slot: trial.set_user_attr("node", slot.node.ip))
        r = TuneTrialResult("fail", error=got.message) if isinstance(got, cluster.Lost) else got
    return r if r.state == "complete" else dataclasses.replace(r, value=value, steps=steps)


# ---- the verb ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneConfig:
    """`trainwise tune`'s own options (model, data and plan come as a StudyConfig), validated here."""

    space: str = option(help="Search space, YAML: lr: {low: 1e-5, high: 1e-3, log: true} ...")
    search: str = option("tpe", "random or tpe (Optuna, pruning), or pbt (Ray Tune; trainwise\\[ray]).")
    trials: int = option(8, "random/tpe: finished trials to reach; pbt: the population.")
    max_steps: int = option(60, "Optimizer steps per trial (the budget unit).")
    eval_every: int = option(20, "Evaluate (and maybe prune) every K steps.")
    monitor: str = take(TrainConfig, "monitor", help="metric (maximised), eval_loss or train_loss (minimised).")
    seed: int = take(StudyConfig, "seed")
    ray_address: str | None = option(
        None, "A Ray cluster (HOST:PORT, ray://HOST:PORT or auto): random/tpe trials side by side, pbt's members."
    )
    cpus_per_trial: float | None = option(None, "pbt: CPUs per member (default: cores / population).")
    # seconds before a trial (random / tpe) is killed and recorded 'timeout'
    trial_timeout: float = take(
        StudyConfig, "trial_timeout", help="random/tpe: seconds before a trial is killed ('timeout')."
    )
    params: tuple[Param, ...] = field(init=False)

    def __post_init__(self) -> None:
        check_search(self.search)
        check_monitor(self.monitor)
        if self.trials <= 0:
            raise ConfigError(f"--trials must be > 0, got {self.trials}")
        check_number("--trial-timeout", self.trial_timeout)
        for name, value in (("--max-steps", self.max_steps), ("--eval-every", self.eval_every)):
            if value <= 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.eval_every > self.max_steps:
            raise ConfigError(
                f"--eval-every {self.eval_every} is more than --max-steps {self.max_steps}: no trial would be "
                "evaluated before it ends; lower --eval-every"
            )
        pbt = self.search == "pbt"
        if not pbt and self.cpus_per_trial is not None:
            raise ConfigError("--cpus-per-trial is for --search pbt (random/tpe trials on a cluster take a whole node)")
        if self.cpus_per_trial is not None and self.cpus_per_trial <= 0:
            raise ConfigError(f"--cpus-per-trial must be > 0, got {self.cpus_per_trial:g}")
        if pbt and self.trials < 2:
            raise ConfigError(f"--search pbt needs a population (--trials) of at least 2, got {self.trials}")
        if pbt and self.max_steps < 2 * self.eval_every:
            raise ConfigError(
                f"--search pbt perturbs every --eval-every steps: --max-steps must be >= 2 x {self.eval_every}"
            )
        object.__setattr__(self, "params", tuple(load_space(self.space)))

    def train_config(self) -> TrainConfig:
        """What every trial trains: --max-steps steps (the budget unit), however many epochs that takes."""
        steps, every, monitor = self.max_steps, self.eval_every, self.monitor
        if self.search == "pbt":  # a member checkpoints at every evaluation, where PBT exploits and explores
            return TrainConfig(
                epochs=10**6, max_steps=steps, eval_every=every, save_every=every, monitor=monitor, keep_checkpoints=1
            )
        return TrainConfig(
            epochs=10**6, max_steps=steps, eval_every=every, save_every=steps, monitor=monitor, checkpoints=False
        )


def check_some_complete(result: TuneResult) -> None:
    """Exit 1 (RunFailed) when the search ran and no trial produced a value."""
    if result.best_value is None:
        errors = [t["error"] for t in result.trials if t.get("error")]
        why = f"; the first: {errors[0]}" if errors else ""
        raise RunFailed(f"no trial of {len(result.trials)} produced a value{why}")


# the `trainwise train` command of the best trial, and a note: (its spec, the result, the config, the data's origin,
# --out) -> (command, note) or None (trainwise.exporting.commands.best_train_command, given by the verb)
CommandOf = Callable[[TrialSpec, TuneResult, "TuneConfig", DataOrigin | None, Path], tuple[str, str | None] | None]


def tune(
    cfg: TuneConfig,
    study: StudyConfig,
    price,
    on_status: Callable[[str], None],
    on_line: Callable[[str], None],
    command_of: CommandOf | None = None,
) -> tuple[TuneResult, dict]:
    """Check, prepare the data once, search; returns the result and tune_result.json's content (cost too, and the
    best trial's train command where `command_of` writes one)."""
    from trainwise.study.prepare import prepare_study  # heavy: trainwise.study.prepare loads numpy
    from trainwise.training.fit import check_one_process  # heavy: trainwise.training.fit loads torch and transformers

    check_task(list(cfg.params), study.task)
    check_one_process(study, "tune")
    out = Path(study.out)
    if cfg.search == "pbt":
        check_pbt(list(cfg.params), cfg.ray_address)
        if (out / EXPERIMENT).exists():
            # Ray can restore the experiment, but its synchronous PBT then waits forever for members
            # it does not restart (seen with Ray 2.60); a half-done population is not resumed
            raise ConfigError(f"{out} already holds a PBT study; PBT studies do not resume: use another --out")
    else:
        cluster.check_address(cfg.ray_address)
    if cfg.search != "pbt" and cfg.ray_address is None:  # trials on a cluster start in Ray's workers
        warm()  # the trials' process imports while the data is prepared
    on_status("trainwise tune: validating input, preparing data and model...")
    spec = prepare_study(study, on_line).specs[0]
    with hold(out):  # one command at a time in --out
        return _search(cfg, spec, out, price, on_line, DataOrigin.of(study), on_status, command_of)


def tie_note(trials: list[dict], search: str, monitor: str | None = None) -> str | None:
    """A line when every finished trial scored the same value: the monitor cannot rank them, and the "best" is only
    the first (seed 000's recipe: ROUGE-L 0.0 for each of 8 trials of a random-init BART after 40 steps)."""
    values = [t["value"] for t in trials if t["state"] == "complete" and t["value"] is not None]
    if len(values) < 2 or max(values) - min(values) > 1e-9 * max(1.0, abs(max(values))):
        return None
    unit = "member" if search == "pbt" else "trial"
    hint = "train longer, or widen the space" if monitor == "eval_loss" else (
        "pass --monitor eval_loss (the validation loss moves from the first steps), or train longer"
    )  # fmt: skip
    said = f"every {unit} scored the same ({values[0]:g}), so the monitor cannot rank them and the best is the first"
    return f"{said}: {hint}"


def shown(values: dict) -> str:
    """Tuned values, as the progress lines and notes show them."""
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _search(
    cfg: TuneConfig,
    spec: TrialSpec,
    out: Path,
    price,
    on_line: Callable[[str], None],
    origin: DataOrigin | None = None,
    on_status: Callable[[str], None] = lambda _text: None,
    command_of: CommandOf | None = None,
) -> tuple[TuneResult, dict]:
    train_args = dataclasses.asdict(cfg.train_config())

    if cfg.search == "pbt":
        cpus = cfg.cpus_per_trial or max(1.0, float((os.cpu_count() or 1) // cfg.trials))
        gpus = 1.0 if spec.settings.device == "cuda" else 0.0

        def on_report(r: dict) -> None:
            on_line(f"  member {r['member']} step {r['step']}: {r['objective']:.4f}  {shown(r['config'])}")

        args = (spec, list(cfg.params), cfg.trials, out, train_args, on_report, cfg.seed, cfg.ray_address, cpus, gpus)
        result = run_pbt(*args)
    else:

        def on_trial(r: dict) -> None:
            value = "-" if r["value"] is None else f"{r['value']:.4f}"
            on_line(f"  trial {r['number']}: {r['state']}  {value}  {r['steps']} steps  {shown(r['params'])}")

        progress = TrainLine()  # one live line: the running trial's step i/N, loss, samples/s, time left

        def on_step(number: int, e: Step) -> None:
            on_status(f"trainwise tune: trial {number}: {progress.line(e)}")

        params = list(cfg.params)
        searched = (spec, params, cfg.search, cfg.trials, out, train_args, on_trial, cfg.seed, cfg.trial_timeout)
        result = run_tune(*searched, on_step=on_step, ray_address=cfg.ray_address)
    report = dataclasses.asdict(result)
    if price is not None:
        # the work a preemption loses: a whole Optuna trial (it has no checkpoints, so it starts over), or
        # one evaluation interval of the population (members run side by side and checkpoint at each)
        if cfg.search == "pbt":
            interval_s = result.machine_s * cfg.eval_every / cfg.max_steps
        else:
            interval_s = result.machine_s / max(1, len(result.trials))
        price = dataclasses.replace(price, checkpoint_hours=interval_s / 3600)
        report["cost"] = {
            "usd": price.cost(result.machine_s),
            "price": price.label,
            "rework": price.rework_factor(),
            "low_priority": price.low_priority,
        }
    if command_of is not None and (command := command_of(spec, result, cfg, origin, out)) is not None:
        report["train_command"], report["train_command_note"] = command
    if (tied := tie_note(result.trials, cfg.search, cfg.monitor)) is not None:
        report["tie_note"] = tied
    write_atomic(out / "tune_result.json", json.dumps(report, indent=1))
    return result, report
