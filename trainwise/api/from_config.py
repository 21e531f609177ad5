"""`trainwise plan --from-config FILE`'s two edges (issue 59): the user's SFTConfig / TrainingArguments file into the
plan's options and a row of the study ("yours"), and the plan back into the same file with only its fields changed
(`trainwise.exporting.user_config` reads and writes the file; `trainwise.api.plan` runs the search between).

- The file's values take the place of the options' defaults (a flag given on the command line wins over the file).
- "yours" is measured beside the baseline and the ecosystem's default, each of its strategies alone too, and the
  plan is tested against it as against the default.
- The search keeps the effective batch (per device x accumulation x processes: 2 x 8 may become 16 x 1) and keeps to
  the strategies the file can switch by its own fields, so the file trains the plan as it stands.
- An SFTConfig's two files, yours and the plan's, are then trained by TRL's own SFTTrainer, interleaved
  (`trainwise.training.own_trainer`, `--trainer-rounds`): the speed-up `trl sft` gets is measured, not inferred from
  trainwise's loop (BENCHMARKS §U1: 1.17x there where the trials said 1.85x).
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.api.options import PlanOptions, words
from trainwise.core.env import package_version
from trainwise.core.errors import ConfigError
from trainwise.exporting import user_config
from trainwise.search import plan_inputs as inputs
from trainwise.search.plan_inputs import plan_of, split_row
from trainwise.search.plan_result import PlanResult

SAVED_OBJECTS = "yours"  # OUT/yours/: where trainwise.api.from_objects saves a caller's objects and their arguments


@dataclass
class Yours:
    """The user's config, what the study took from it, and its row."""

    cfg: user_config.UserConfig
    reading: user_config.Reading
    task: str
    notes: tuple[str, ...] = ()  # what the plan says of the file before it measures it (a precision emulated here)

    @property
    def row(self) -> str:
        return self.reading.row

    @property
    def always(self) -> frozenset[str]:
        """The strategies of yours that no field of its file switches (the collator's padding to the longest): the
        file trains them whatever the plan writes into it, so every candidate keeps them."""
        fields_ = user_config.strategy_fields(self.cfg.kind)
        return frozenset(n for n in split_row(self.row)[0] if n in fields_ and not fields_[n])


def prepare(options: PlanOptions, given: set[str] | None = None, objects: bool = False) -> tuple[PlanOptions, Yours]:
    """The plan's options with the file's values where no flag was given (`given`: the options named on the command
    line or in the call; None: those that differ from their defaults), and the user's row. `objects`: the file holds
    a caller's objects (`trainwise.plan(trainer=...)`), which train in the caller's process, not through `trl sft`."""
    assert options.from_config is not None
    chosen = _given(options, given)
    cfg, reading, task, device, caps, updates = _read(options, options.from_config, chosen)
    runnable = inputs.validity(task, 1, caps)

    def valid(row: str) -> str | None:
        return runnable(inputs.split_row(row)[0]) if row != "baseline" else None

    if reading.epochs is not None and "run_epochs" not in chosen:
        updates["run_epochs"] = reading.epochs
    updates["batch_search"] = False  # the effective batch is the user's: the plan changes how it is made up
    can = user_config.expressible(cfg.kind, task)
    only = frozenset(words(options.only)) if options.only else can
    updates["only"] = ",".join(sorted(only & can)) or None
    if not updates["only"]:
        raise ConfigError(f"--only {options.only}: none of them can be written into {cfg.label}")
    if "strategies" not in chosen:  # the default rows a file of this kind can switch that run natively here
        from trainwise.study.prepare import too_slow  # heavy: torch (the device's precision probe)

        slow = too_slow(list(strategies.REGISTRY), device, caps)
        rows = [
            r
            for r in strategies.default_rows(task, device)
            if r == "baseline" or (r in can and valid(r) is None and r not in slow)
        ]
        updates["strategies"] = ",".join(rows)
    try:
        new = dataclasses.replace(options, **updates)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--from-config {options.from_config}: {e}") from None
    untimed = _trl_step(cfg) if options.trainer_rounds == 0 else ()
    notes = (*_emulated(cfg, reading, device, caps), *untimed, *(() if objects else _one_thread(cfg, device)))
    return new, Yours(cfg, reading, task, notes)


def _one_thread(cfg: user_config.UserConfig, device: str) -> tuple[str, ...]:
    """`trl sft` starts its training through `accelerate launch`, which on a CPU sets OMP_NUM_THREADS to 1 where it is
    not set (BENCHMARKS §U1: 9.3 s a step where the same file took 5.4 s on this machine's two threads): the trials
    and the check in TRL's trainer run on torch's threads, so the file trains as measured with OMP_NUM_THREADS set."""
    if cfg.kind != user_config.SFT or device != "cpu" or os.environ.get("OMP_NUM_THREADS"):
        return ()
    import torch  # heavy: torch (loaded by the study's preparation already)

    n = torch.get_num_threads()
    if n < 2:
        return ()
    return (
        f"`trl sft` trains through `accelerate launch`, which on a CPU runs it on one thread unless OMP_NUM_THREADS is "
        f"set: the rows are measured on this machine's {n}; run `OMP_NUM_THREADS={n} trl sft --config FILE` to train "
        "your file or the plan's as measured",
    )


def _emulated(
    cfg: user_config.UserConfig, reading: user_config.Reading, device: str, caps: set[str]
) -> tuple[str, ...]:
    """A line for each precision of yours this device only emulates, and which field (or the class's default) asks
    for it: TRL's SFTConfig trains bf16 by default, on a CPU without bf16 too, several times slower than fp32."""
    from trainwise.study.prepare import too_slow  # heavy: torch (the device's precision probe)

    out = []
    for name, why in too_slow(sorted(split_row(reading.row)[0]), device, caps).items():
        whose = "as your file sets it" if name in cfg.fields else f"the {cfg.label.split()[1]} default"
        out.append(
            f"yours trains {name} ({whose}), which this {device} only emulates ({why}): it is measured as it would "
            f"train here, and `{name}: false` trains fp32; the plan writes that where fp32 is faster"
        )
    return tuple(out)


def _trl_step(cfg: user_config.UserConfig) -> tuple[str, ...]:
    """What the trials do not time for an SFTConfig when --trainer-rounds 0 skips the check in TRL's own trainer: TRL's
    step (BENCHMARKS §U1: its data is TRL's, its step trainwise's loop)."""
    if cfg.kind != user_config.SFT:
        return ()
    return (
        "the rows are timed with trainwise's training loop on the examples TRL's SFTTrainer builds (its cut and drop), "
        "not with SFTTrainer's own step, which also computes each token's entropy and top-1 accuracy through its LM "
        "head for its logs: `trl sft` may run the file at a smaller speed-up than the plan states (--trainer-rounds 0; "
        "the default times both files in SFTTrainer)",
    )


def _read(options: Any, path: str, chosen: set[str], probe: bool = True) -> tuple:
    """The file at `path` as (its config, what a study takes from it, the task, the device and its capabilities, the
    options it sets where none of `chosen` says otherwise). `probe`: the device is this machine's (a study runs on
    it); without, the device named is a target (an estimate for a GPU, on a machine without one: a GPU from Ampere
    on, bf16 and fp16 native)."""
    from trainwise.study.prepare import resolve_device  # heavy: torch

    cfg = user_config.read(path, options.task if "task" in chosen else None)
    task = options.task if cfg.kind == user_config.TRAINER else "causal-lm"
    if probe or options.device != "cuda":
        device, caps = resolve_device(options.device)
    else:
        device, caps = "cuda", {"cuda", "fp16", "bf16"}
    runnable = inputs.validity(task, 1, caps)

    def valid(row: str) -> str | None:
        return runnable(inputs.split_row(row)[0]) if row != "baseline" else None

    reading = user_config.reading(cfg, device, valid, options.nproc)
    # a flag wins over the file, and over what the file says in its place (--model-preset over model_name_or_path)
    instead = {"model": "model_preset", "model_preset": "model", "train_file": "dataset", "dataset": "train_file"}
    updates = {k: v for k, v in reading.options.items() if k not in chosen and instead.get(k) not in chosen}
    return cfg, reading, task, device, caps, updates


def settings(options: Any, path: str, given: set[str], probe: bool = True) -> tuple[Any, str, list[str]]:
    """The options of another verb (compare, estimate) with the file's values where `given` names none, its row
    yours (the file's strategies, as `trainwise plan --from-config` measures it), and the fields of the file the rows
    do not reproduce, in words (`probe`: see `_read`; an estimate's device is a target)."""
    _cfg, reading, _task, _device, _caps, updates = _read(options, path, given, probe)
    known = {f.name for f in fields(options) if f.init}
    try:
        new = dataclasses.replace(options, **{k: v for k, v in updates.items() if k in known})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    return new, reading.row, list(reading.unhonoured)


def _given(options: PlanOptions, given: set[str] | None) -> set[str]:
    if given is not None:
        return given
    return {f.name for f in fields(options) if f.init and getattr(options, f.name) != f.default}


def finish(
    yours: Yours,
    result: PlanResult,
    versus: dict[str, dict],
    cfg: Any,
    device: str,
    options: PlanOptions,
    say: Callable,
) -> None:
    """The plan written back into the user's file (OUT/plan.sft.yaml or plan.args.json), and what changed, against
    what, into the result (`result.yours`); then, for an SFTConfig, both files timed in TRL's own trainer
    (`in_own_trainer`: --trainer-rounds of --trainer-steps timed steps). `cfg`: the study's StudyConfig; `say`: a line
    for the user."""
    out = {
        "label": yours.cfg.label,
        "file": str(yours.cfg.path),
        "row": yours.row,
        "said": yours.reading.said,
        "unhonoured": [*yours.notes, *yours.reading.unhonoured],
        "per_device": yours.reading.per_device,
        "accum": yours.reading.accum,
    }
    if result.plan:
        names, own = split_row(result.plan)
        plan = plan_of(names, yours.reading.accum)
        if plan is not None:
            where = "cpu" if yours.reading.options.get("device") == "cpu" else "cuda"
            size = own or cfg.batch_size
            written = user_config.write_back(
                yours.cfg, plan, size, yours.task, cfg.max_length, Path(result.study), cfg.nproc, where
            )
            out.update(written=str(written.path), changes=[list(c) for c in written.changes], line=written.line())
        out["versus"] = versus.get(result.plan)
    result.yours = _jsonable(out)
    say(f"your file: {out.get('line') or 'no plan'} ({out.get('written', '-')})")
    in_own_trainer(yours, result, cfg, device, options.trainer_rounds, say, options.trainer_steps)


def _jsonable(d: Any) -> Any:
    if isinstance(d, dict):
        return {str(k): _jsonable(v) for k, v in d.items()}
    if isinstance(d, list | tuple):
        return [_jsonable(v) for v in d]
    if d is None or isinstance(d, bool | int | float | str):
        return d
    return str(getattr(d, "value", d))


def in_own_trainer(
    yours: Yours, result: PlanResult, cfg: Any, device: str, rounds: int, say: Callable[[str], None], steps: int
) -> None:
    """Your file and the plan's (`result.yours["written"]`) trained by TRL's SFTTrainer as `trl sft` builds it,
    `rounds` times each, interleaved (yours first, then the plan first, ...), each the study's warm-up steps untimed
    and `steps` timed: the speed-up measured there into `result.yours["trainer"]`, by round and with a 90% interval
    from the timed steps (`step_interval`). An SFTConfig only (a Trainer's
    step is trainwise's loop's: §U2 measured 2.22x where 2.31x was stated); nothing when the plan is yours, or no file
    was written. A run that fails is said and recorded; the plan stands."""
    mine = result.yours or {}
    if rounds < 1 or yours.cfg.kind != user_config.SFT or not mine.get("written") or not mine.get("changes"):
        return
    from trainwise.training.own_trainer import Data, TrainerRun, time_file  # the job (its child imports TRL)

    eff = yours.cfg.effective()
    names = {cfg.prompt_column: "prompt", cfg.response_column: "completion", cfg.messages_column: "messages"}
    names[cfg.text_column] = str(eff.get("dataset_text_field") or "text")
    data = Data(
        cfg.train_file,
        cfg.dataset if cfg.train_file is None else None,
        str(eff.get("dataset_train_split") or "train"),
        {k: v for k, v in names.items() if k},
        cfg.max_train_samples,
    )
    files = {"yours": str(yours.cfg.path), "plan": mine["written"]}
    preset = cfg.model_preset
    model = None if preset or cfg.model == eff.get("model_name_or_path") else cfg.model
    tokenizer = str(Path(result.study) / "tokenizer") if preset else None
    runs: dict[str, list[dict]] = {"yours": [], "plan": []}
    for i in range(rounds):
        for label in ("yours", "plan") if i % 2 == 0 else ("plan", "yours"):
            out = Path(result.study) / "trainer" / f"{label}-{i + 1}"
            job = TrainerRun(
                files[label], label, str(out), cfg.warmup_steps + steps, cfg.warmup_steps, cfg.seed, device, data,
                model, preset, tokenizer,
            )  # fmt: skip
            got = time_file(job, cfg.trial_timeout)
            said = f"{got.step_time_median_s:.2f} s/step" if got.status == "ok" else f"{got.status}: {got.message}"
            say(f"TRL's SFTTrainer, round {i + 1} of {rounds}: {label} {said}")
            runs[label].append(_run_of(got))
    trl = package_version("trl")  # (the child imported it: installed)
    check: dict[str, Any] = {"trainer": f"TRL {trl} SFTTrainer" if trl else "TRL's SFTTrainer", "rounds": rounds}
    check["steps"] = cfg.warmup_steps + steps
    check |= {"warmup": cfg.warmup_steps, **runs}
    failed = next((r for rs in runs.values() for r in rs if r["status"] != "ok"), None)
    if failed is not None:
        check["error"] = f"{failed['status']}: {failed['message']}"
    else:
        by_round = [a["epoch_s"] / b["epoch_s"] for a, b in zip(runs["yours"], runs["plan"], strict=True)]
        mid = statistics.median(r["epoch_s"] for r in runs["yours"]) / statistics.median(
            r["epoch_s"] for r in runs["plan"]
        )
        check |= {"ratio": mid, "by_round": by_round, "low": min(by_round), "high": max(by_round)}
        check["interval"] = step_interval(runs["yours"], runs["plan"])
        check["faster"] = check["interval"][0] > 1.0 if check["interval"] else mid > 1.0
        check["every_round"] = min(by_round) > 1.0 if mid > 1.0 else max(by_round) <= 1.0
    mine["trainer"] = check


def step_interval(yours: list[dict], plan: list[dict], draws: int = 2000) -> list[float] | None:
    """The 90% interval of yours' epoch over the plan's, the statistic `in_own_trainer` states (each run's epoch is its
    median step times its steps an epoch; each file's, the median over its runs), from the runs' timed steps: each
    run's steps drawn again with replacement, 5th and 95th percentiles of the ratio (a fixed seed: the same runs give
    the same interval). The rounds' spread (`by_round`) is the drift between runs, which this does not see. None where
    a run kept no steps."""
    if any(not r.get("step_times_s") or not r.get("s_per_step") for r in (*yours, *plan)):
        return None
    rng = random.Random(0)

    def epoch(runs: list[dict]) -> float:  # (steps an epoch: epoch_s is that times the run's median step)
        return statistics.median(
            r["epoch_s"] / r["s_per_step"] * statistics.median(rng.choices(r["step_times_s"], k=len(r["step_times_s"])))
            for r in runs
        )

    ratios = sorted(epoch(yours) / epoch(plan) for _ in range(draws))
    return [ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]]


def _run_of(r: Any) -> dict[str, Any]:
    """A trainer run's record in plan.json (`yours.trainer`): TrialResult's fields under the names plan.md reads."""
    names = {"step_time_median_s": "s_per_step", "epoch_time_s": "epoch_s", "step_times_s": "step_times_s"}
    names |= {k: k for k in ("status", "message", "samples_per_s", "final_loss", "wall_s")}
    got = r.to_dict()
    return {mine: got[theirs] for theirs, mine in names.items()}
