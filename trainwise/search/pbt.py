"""trainwise tune --search pbt: population-based training with Ray Tune on trainwise's own run.

Each member of the population is a `run_train` in a Ray worker process (its own process, as every
trial). It checkpoints every `--eval-every` steps and reports the evaluation with the checkpoint.
Ray's PopulationBasedTraining then exploits and explores: at each interval, a member in the bottom
quantile stops and continues from the checkpoint of a member in the top quantile
(`run_train(adopt=...)`), with that member's hyper-parameters perturbed (x0.8 or x1.2, or
resampled from the space). The learning rate, weight decay and label smoothing are mutated. Batch
size and warm-up are drawn once per member and travel with the checkpoint, since the sampler
position and the schedule's shape belong to them.

Not `Trainer.hyperparameter_search`: its Ray integration is known to break on checkpoint handling.
Here a checkpoint is trainwise's own (verified, fingerprinted) directory, which Ray only copies.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from trainwise.core.config import maximize, monitored
from trainwise.core.errors import ConfigError
from trainwise.run import cluster
from trainwise.run.events import Checkpoint, Eval, Event, Step
from trainwise.search.space import PARAMS, Param, TuneResult, apply
from trainwise.spec.config import TrialSpec

# continued from a checkpoint with a new value (decoding only changes how evaluation generates)
MUTABLE = ("lr", "weight_decay", "label_smoothing", "num_beams", "length_penalty")
EXPERIMENT = "pbt"
# who hears of each report in this driver process. Not held by the callback itself: Ray pickles
# its run config, and a console (with its lock) cannot be pickled.
_LISTENERS: list[Callable[[dict], None]] = []


def _ray():
    try:
        import ray  # optional: trainwise[ray]
        from ray import tune  # optional: trainwise[ray]
    except ImportError:
        raise ConfigError("--search pbt needs Ray Tune: pip install 'trainwise[ray]'") from None
    return ray, tune


def check_pbt(space: list[Param], ray_address: str | None = None) -> None:
    """What --search pbt needs, checked at the edge: Ray, something to mutate, a reachable cluster
    (Ray itself retries an unreachable address for minutes)."""
    _ray()
    cluster.check_address(ray_address)
    if not any(p.name in MUTABLE for p in space):
        raise ConfigError(
            f"--search pbt mutates {', '.join(MUTABLE)} during training: put at least one of them in the space"
        )


def domains(space: list[Param]) -> dict:
    """The space as Ray Tune sampling domains."""
    _, tune = _ray()
    out = {}
    for p in space:
        if p.choices is not None:
            out[p.name] = tune.choice(list(p.choices))
            continue
        assert p.low is not None and p.high is not None, "load_space gives ranges their bounds"
        if PARAMS[p.name].kind == "int":
            low, high = int(p.low), int(p.high) + 1  # randint excludes its upper bound
            out[p.name] = tune.lograndint(low, high) if p.log else tune.randint(low, high)
        else:
            out[p.name] = tune.loguniform(p.low, p.high) if p.log else tune.uniform(p.low, p.high)
    return out


def objective(record: dict, monitor: str) -> float | None:
    return monitored(record, monitor)


# ---- a member, in a Ray worker ------------------------------------------------------------------


def _member(config: dict, spec_blob: dict, train_args: dict, scratch: str) -> None:
    """One member's run: from scratch, or from the checkpoint PBT hands it (with a new config)."""
    import ray  # optional: trainwise[ray]
    import torch  # heavy: torch
    from ray import tune  # optional: trainwise[ray]

    # heavy: trainwise.training.fit loads torch and transformers
    from trainwise.training.fit import (
        TrainConfig,
        TrainJob,
        run_train,
    )

    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    torch.set_num_threads(max(1, int(cpus)))
    spec = apply(TrialSpec.from_dict(spec_blob), config)
    tc = TrainConfig(**train_args)
    trial_id = tune.get_context().get_trial_id()
    for stale in Path(scratch).glob(f"{trial_id}-*"):  # an earlier run of this member that was killed
        if not _alive(int(stale.name.split("-")[1])):
            shutil.rmtree(stale, ignore_errors=True)
    work = Path(scratch) / f"{trial_id}-{os.getpid()}-{time.time_ns()}"
    work.mkdir(parents=True)
    last: dict = {}
    start: list[int] = []
    planned: list[int] = []

    def emit(event: Event) -> None:
        if isinstance(event, Step) and not start:
            start.append(event.step - 1)
            planned.append(event.total)
        elif isinstance(event, Eval):
            last.clear()
            last.update(event.record)
        elif isinstance(event, Checkpoint) and last.get("step") == event.step:
            value = objective(last, tc.monitor)
            ran = event.step - start[-1]
            start.append(event.step)
            metrics = {k: v for k, v in last.items() if k != "best" and isinstance(v, int | float)}
            # the config it trained with: by the time the driver's callback sees this report, PBT may have
            # already given the trial its next config
            # the last step's report says it is done: Tune then stops the member without asking PBT, which would
            # otherwise hand it a donor's checkpoint to start again from the end (a new actor, the model loaded
            # again, no step trained: 16 s of a 56 s two-member run here)
            done = bool(planned) and event.step >= planned[0]
            tune.report(
                {**metrics, "objective": float("nan") if value is None else value, "ran": ran, "at": time.time()}
                | {"trained_with": dict(config), "done": done},
                checkpoint=tune.Checkpoint.from_directory(event.path),
            )

    try:
        adopt = None
        handed = tune.get_checkpoint()
        if handed is not None:
            adopt = work / "adopted"
            with handed.as_directory() as d:
                shutil.copytree(d, adopt)
        run_train(TrainJob(spec, tc, work / "run"), emit, adopt=adopt)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def member_scratch(out: Path, ray_address: str | None) -> Path:
    """Where members train: under --out on this machine; on a cluster (whose nodes may not see --out),
    a folder of this user's in the node's temporary directory, never one shared between users."""
    if ray_address is None:
        return out / "pbt-members"
    return Path(tempfile.gettempdir()) / f"trainwise-pbt-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True  # running (PermissionError: running as another user)


# ---- the driver ---------------------------------------------------------------------------------


def run_pbt(
    spec: TrialSpec,
    space: list[Param],
    population: int,
    out: Path,
    train_args: dict,
    on_report: Callable[[dict], None],
    seed: int = 0,
    ray_address: str | None = None,
    cpus_per_member: float = 1.0,
    gpus_per_member: float = 0.0,
) -> TuneResult:
    """Run the population; the result has one row per member, the curve of best-so-far against
    the optimizer steps the whole population ran, the mutations, and the machine time. The space
    and the address were checked at the edge (`check_pbt`)."""
    ray, tune = _ray()
    from ray.tune import Callback  # optional: trainwise[ray]
    from ray.tune.schedulers import PopulationBasedTraining  # optional: trainwise[ray]
    from ray.tune.search.basic_variant import BasicVariantGenerator  # optional: trainwise[ray]

    if train_args["eval_every"] != train_args["save_every"]:
        raise ConfigError("pbt perturbs at evaluations, so it checkpoints at each: eval_every must equal save_every")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    # the member's relative paths (data files) stay valid; Ray's console output (its trial tables and boxes) is
    # replaced by trainwise's own lines; members restart by design (Ray's reuse_actors warning)
    cluster.connect(ray_address, {"RAY_CHDIR_TO_TRIAL_DIR": "0"})
    reports_path = out / "pbt_reports.jsonl"
    space_domains = domains(space)
    try:
        scheduler = PopulationBasedTraining(
            time_attr="step",
            perturbation_interval=train_args["eval_every"],
            hyperparam_mutations={k: v for k, v in space_domains.items() if k in MUTABLE},
            quantile_fraction=0.25,
            resample_probability=0.25,
            synch=True,
        )
        random.seed(seed)  # PBT's explore draws from the driver's `random`
        member = tune.with_resources(
            partial(
                _member, spec_blob=spec.to_dict(), train_args=train_args, scratch=str(member_scratch(out, ray_address))
            ),
            {"cpu": cpus_per_member, "gpu": gpus_per_member},
        )

        class Reports(Callback):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                row = {
                    "member": member_number(trial.trial_id),
                    "step": result["step"],
                    "ran": result["ran"],
                    "at": result["at"],
                    "objective": result["objective"],
                    "config": dict(sorted(result["trained_with"].items())),
                }
                if ray_address is not None:  # on a cluster, where the member trained this interval (Tune's field)
                    row["node"] = result.get("node_ip")
                with open(reports_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                for listener in _LISTENERS:
                    listener(row)

        tuner = tune.Tuner(
            member,
            param_space=space_domains,
            tune_config=tune.TuneConfig(
                metric="objective",
                mode="max" if maximize(train_args["monitor"]) else "min",
                scheduler=scheduler,
                num_samples=population,
                search_alg=BasicVariantGenerator(random_state=seed),
                reuse_actors=False,
            ),
            run_config=tune.RunConfig(
                name=EXPERIMENT,
                storage_path=str(out),
                verbose=0,
                callbacks=[Reports()],
                # the latest is what a donor hands on; Ray warns that fewer than 3 risk a race
                checkpoint_config=tune.CheckpointConfig(num_to_keep=3),
            ),
        )
        started = time.perf_counter()
        _LISTENERS.append(on_report)
        try:
            grid = tuner.fit()
        finally:
            _LISTENERS.remove(on_report)
        wall_s = time.perf_counter() - started
        errors = tuple(
            (member_number(r.metrics["trial_id"]) if "trial_id" in r.metrics else None, _last_words(r.error))
            for r in grid
            if r.error
        )
    finally:
        ray.shutdown()
    mutations = _mutations(out / EXPERIMENT)
    result = summarise(_read_reports(reports_path), mutations, train_args["monitor"], errors)
    result.machine_s = wall_s  # the members share the machine, so its time is the study's
    return result


def _last_words(error: BaseException) -> str:
    """A member's error on one line: the end of Ray's wrapped traceback, where the cause is."""
    return " ".join(str(error).split())[-300:]


def _read_reports(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def member_number(trial_id: str) -> int:
    """Ray's trial id `<experiment>_<index>` as the member's number."""
    return int(trial_id.rsplit("_", 1)[1])


def _mutations(experiment: Path) -> list[dict]:
    """Ray PBT's log of exploit/explore decisions: which member continued from which donor's
    checkpoint, and the config before (the donor's) and after (perturbed). `summarise` adds the
    step from the member's reports."""
    log = experiment / "pbt_global.txt"
    if not log.is_file():
        return []
    rows = []
    for line in log.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, ValueError):
            member, donor, _, _, old, new = json.loads(line)
            # Ray's tags start with the member's index
            rows.append({"member": int(member.split("_", 1)[0]), "from": int(donor.split("_", 1)[0])})
            rows[-1].update(old=old, new=new)
    return rows


def summarise(
    reports: list[dict], mutations: list[dict], monitor: str, errors: tuple[tuple[int | None, str], ...] = ()
) -> TuneResult:
    """Rows per member, best-so-far against the steps the whole population has run, the best config
    (the one in effect when the best evaluation was made)."""
    higher = maximize(monitor)
    better = (lambda a, b: a > b) if higher else (lambda a, b: a < b)
    curve: list[tuple[int, float]] = []
    spent, best_row = 0, None
    members: dict[int, dict] = {}
    for r in sorted(reports, key=lambda r: r["at"]):
        spent += int(r["ran"])
        m = members.setdefault(r["member"], {"value": None, "steps": 0})
        m["steps"] += int(r["ran"])
        m["params"] = r["config"]
        if "node" in r:  # on a cluster: where it trained last
            m["node"] = r["node"]
        v = r["objective"]
        if v is None or not math.isfinite(v):
            continue
        if m["value"] is None or better(v, m["value"]):
            m["value"] = v
        if best_row is None or better(v, best_row["objective"]):
            best_row = r
        curve.append((spent, best_row["objective"]))
    for m in mutations:
        # the step it continued from: where the member's first report with the new config started
        after = [r for r in reports if r["member"] == m["member"] and r["config"] == dict(sorted(m["new"].items()))]
        m["step"] = min(r["step"] - r["ran"] for r in after) if after else None  # None: at the end
    failed = dict(errors)
    trials = [
        {
            "number": member,
            "state": "fail" if member in failed else "complete",
            "value": m["value"],
            "params": m["params"],
            "steps": m["steps"],
            **({"node": m["node"]} if "node" in m else {}),
        }
        for member, m in sorted(members.items())
    ]
    for member, error in errors:
        row = next((t for t in trials if t["number"] == member), None)
        if row is None:  # failed before its first report
            row = {"number": -1 if member is None else member, "state": "fail", "value": None, "params": {}}
            trials.append({**row, "steps": 0})
            row = trials[-1]
        row["error"] = error
    return TuneResult(
        best_value=None if best_row is None else best_row["objective"],
        best_params={} if best_row is None else best_row["config"],
        trials=trials,
        curve=curve,
        mutations=mutations,
    )
