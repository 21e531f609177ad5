"""Every verb's options: one frozen dataclass per verb whose fields are the CLI's flags (`max_steps` is
`--max-steps`), the Python API's keyword arguments and a study file's keys. A verb inherits the groups it reads
(api/groups.py: a study's groups from trainwise/spec/groups.py, the price, the limits) and the library config it is
built on (`TuneConfig`, `TrainConfig`, `ExportConfig`, `FindBatchConfig`, estimate's `EstimateFields`): an option is
declared once, there, and a verb re-states a field (`take`) only with its own default, words or type, or alone out of
a group. The options no library config reads (a run's --out, the quality phase, the plan's search, train's --resume
and machines) are declared here, once.

`Options.of` is the one edge where they are checked: names (an unknown one names the closest), types, and a
`config=` YAML file whose keys are the same names (given options win over it). The libraries' own configs
(`StudyConfig`, `EstimateConfig`, ...) validate the values."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.api.groups import (
    _STUDY,
    REPLACE,
    Limits,
    Measurement,
    ModelData,
    Options,
    Priced,
    Scale,
    Shape,
    Training,
)
from trainwise.core.config import TrainConfig
from trainwise.core.errors import ConfigError
from trainwise.core.option import PRICE, QUALITY, RUN, flag, ints, option, take, words
from trainwise.estimating.data import EstimateConfig, EstimateFields
from trainwise.exporting.scripts import ExportConfig
from trainwise.run import cluster
from trainwise.search import verdicts as quality
from trainwise.search.batch_size import FindBatchConfig
from trainwise.search.hyperparams import TuneConfig
from trainwise.spec import groups as spec
from trainwise.spec.config import StudyConfig
from trainwise.training.tracking import compare_report_to


@dataclass(frozen=True, kw_only=True)
class CompareOptions(Scale, Measurement, Training, Shape, ModelData, Priced):
    """`trainwise compare`: one trial per strategy row on the same model and data. Lists may be given as
    Python lists or as the CLI's comma text. Its options are the groups' (ModelData, Shape, Training, Measurement,
    Scale, Priced) and its own few below."""

    VERB = "compare"
    strategies: str | list[str] = take(StudyConfig, "strategies")
    out: str = take(StudyConfig, "out")
    replace: bool = flag("replace", REPLACE, role=RUN, saved=False)
    checkpoint_minutes: float = option(30.0, "Cost, low-priority: minutes between checkpoints.", role=PRICE)
    report_to: str | None = option(
        None, "wandb: a W&B run per trial, grouped by the study, and the table; trainwise\\[wandb].", role=RUN
    )
    quality_steps: int | None = option(None, "Then train the Pareto rows this long for quality.", role=QUALITY)
    seeds: int = option(2, "Quality phase: seeds per row (the spread of the verdicts).", role=QUALITY)

    def __post_init__(self) -> None:
        # the text tasks' default rows on a task with rows of its own: that task's, before anything reads them (a
        # resumed study adds the rows it is missing: the task's, not the text tasks')
        given = [r.strip() for r in words(self.strategies)]
        if self.task in strategies.TASK_DEFAULTS and given == list(strategies.DEFAULT_ROWS):
            object.__setattr__(self, "strategies", ",".join(strategies.default_rows(self.task)))

    def resolve(self) -> tuple[StudyConfig, Any, tuple[int, int] | None]:
        """(the StudyConfig, the price or None, (quality steps, seeds) or None), every value validated."""
        quality.check(self.quality_steps, self.seeds)
        compare_report_to(self.report_to)
        cluster.check_address(self.ray_address)
        cfg = self.study_config(
            batch_sizes=ints(self.batch_sizes, "--batch-sizes") if self.batch_sizes else (),
            num_workers=ints(self.num_workers, "--num-workers"),
        )
        return (
            cfg,
            self.price(self.checkpoint_minutes),
            (self.quality_steps, self.seeds) if self.quality_steps else None,
        )


def _needs_company(name: str) -> bool:
    found = strategies.REGISTRY.get(name.partition("=")[0].strip())
    return found is not None and bool(found.with_one_of)


@dataclass(frozen=True, kw_only=True)
class AdviseOptions(Shape, ModelData, Limits):
    """`trainwise advise`: rank a study's rows under constraints (--run: run or resume the study first)."""

    VERB = "advise"
    study: list[str] = option(help="Study dirs: `trainwise compare` --out.", argument=True, metavar="STUDY")
    run: bool = flag("run", "Run (or resume) the study into STUDY first, as compare.")
    replace: bool = flag("replace", "--run: " + REPLACE, saved=False)
    # --run runs compare: its model, data, shape, rows, steps and device (the others at compare's defaults)
    strategies: str | list[str] = take(StudyConfig, "strategies")
    max_steps: int = take(StudyConfig, "max_steps", help="--run: optimizer steps per trial.")
    device: str = take(StudyConfig, "device")

    def paths(self) -> list[Path]:
        if self.run and len(self.study) > 1:
            raise ConfigError("--run runs one study: give one STUDY with --run")
        return [Path(s) for s in self.study]

    def compare_options(self) -> CompareOptions:
        """--run: the options compare runs STUDY with (its other options at compare's defaults)."""
        shared = {f.name for f in fields(CompareOptions)} & {f.name for f in fields(self)}
        warmup = min(_STUDY["warmup_steps"], self.max_steps - 1)
        return CompareOptions(**{k: getattr(self, k) for k in shared}, out=self.study[0], warmup_steps=warmup)


@dataclass(frozen=True, kw_only=True)
class PlanOptions(CompareOptions, Limits):
    """`trainwise plan`: search combinations of the rows that helped, measure the most promising as rows of the
    same study, and recommend the measured best (compare's options say the study and its single rows)."""

    VERB = "plan"
    study: str | None = option(None, "Start from this compare study (its --out and settings) \\[default: --out].")
    objective: str = take(Limits, "objective", help="What to optimise: time or cost (one machine: as time).")
    max_trials: int = option(8, "Search budget: combination rows measured at most.")
    max_search_time: str | None = option(
        None, "Search budget: the plan's wall time, single rows included, e.g. 20m (the trial in flight ends)."
    )
    only: str | None = option(None, "Combine only these strategies (comma list).")
    never: str | None = option(None, "Never combine these strategies (comma list).")
    quality_check: bool = option(
        True, "Train the plan and the baseline longer on paired seeds, tested sequentially, before recommending."
    )
    batch_search: bool = option(
        True, "Also search larger batches (`row@bsN`): a doubling at a time while one is expected to pay and fits."
    )
    ecosystem_default: bool = option(
        True,
        "Also measure what you get without trainwise (TRL's SFTConfig defaults for causal-lm, the HF Trainer's "
        "otherwise) as a row; the plan is never slower than it.",
    )
    run_epochs: float = option(
        1.0, "The run you plan, in epochs of the data: a one-time cost (torch.compile) is charged once against it."
    )
    from_config: str | None = option(
        None,
        "Plan your own training: a TRL SFTConfig YAML/JSON (as `trl sft --config` reads it) or a TrainingArguments "
        "JSON/YAML. Its model, data, batch and settings make the study, it is measured as the row 'yours', and the "
        "plan is written back into the same file (OUT/plan.sft.yaml or OUT/plan.args.json), only its fields changed.",
    )
    trainer_rounds: int = option(
        2,
        "--from-config with an SFTConfig: then train your file and the plan's in TRL's own SFTTrainer (as `trl sft` "
        "builds it), interleaved, this many times each, and state that speed-up; 0: none.",
    )
    trainer_steps: int = option(
        8,
        "--from-config with an SFTConfig: the steps a run in TRL's trainer times (2 or more), after the study's "
        "warm-up steps (every batch's length differs with dynamic padding: more steps, a narrower interval).",
    )

    def __post_init__(self) -> None:
        """The plan's own options checked as they are made (again on `dataclasses.replace`: --from-config's file
        may set run_epochs)."""
        super().__post_init__()
        if self.objective == "quality":
            raise ConfigError("--objective quality: plan searches for speed; bound quality with --max-quality-drop")
        if self.max_trials < 1:
            raise ConfigError(f"--max-trials must be >= 1, got {self.max_trials}")
        if self.trainer_rounds < 0:
            raise ConfigError(f"--trainer-rounds must be >= 0, got {self.trainer_rounds}")
        if self.trainer_steps < 2:
            raise ConfigError(f"--trainer-steps must be >= 2, got {self.trainer_steps}")
        if self.run_epochs <= 0:
            raise ConfigError(f"--run-epochs must be > 0, got {self.run_epochs:g}")

    def combining(self) -> tuple[frozenset[str], frozenset[str]]:
        """--only and --never as strategy names, each checked against the registry."""
        found = []
        for text, name in ((self.only, "--only"), (self.never, "--never")):
            names = frozenset(words(text)) if text else frozenset()
            unknown = sorted(n for n in names if n not in strategies.REGISTRY or n == "baseline")
            if unknown:
                raise ConfigError(f"{name}: unknown strategy {unknown[0]!r}; valid names: {strategies.valid_names()}")
            found.append(names)
        return found[0], found[1]

    def compare_options(self) -> CompareOptions:
        """The study the search runs in: --study's own options (its study.yaml), else this run's."""
        if self.study is None:
            shared = {f.name for f in fields(CompareOptions)}
            # --quality-steps / --seeds are the plan's quality check, not a quality phase of every Pareto row
            values = {k: getattr(self, k) for k in shared if k not in ("quality_steps", "seeds")}
            rows = [r.strip() for r in words(self.strategies)]
            # the search combines single rows: a combination given (seed 004's dynamic_pad+smart_batch) is measured
            # as given, and each of its strategies alone too, so the search can combine them with the others
            parts = [n.strip() for r in rows if "+" in r for n in r.partition("@bs")[0].split("+")]
            # (not a strategy that runs only beside another: cce is measured as bf16+cce, its effect read off it)
            parts = [n for n in parts if n and n != "baseline" and not _needs_company(n)]
            rows += [n for i, n in enumerate(parts) if n not in rows and n not in parts[:i]]
            # every figure of the search is relative to the baseline: a --strategies list without it still runs it
            values["strategies"] = rows if "baseline" in rows else ["baseline", *rows]
            return CompareOptions(**values)
        found = Path(self.study) / "study.yaml"
        if not found.is_file():
            raise ConfigError(
                f"--study {self.study}: no study.yaml there (a study written by `trainwise compare`); give the "
                "model and data options instead, with --out"
            )
        return dataclasses.replace(CompareOptions.of({}, found), out=self.study)


@dataclass(frozen=True, kw_only=True)
class EstimateOptions(EstimateFields, spec.Model, Options):
    """`trainwise estimate`: each plan's peak training memory without training (EstimateConfig's options, checked
    when resolved, once the model and the data are known, and the model it resolves)."""

    VERB = "estimate"

    def resolve(self) -> EstimateConfig:
        return EstimateConfig(**{f.name: getattr(self, f.name) for f in fields(EstimateFields)})


@dataclass(frozen=True, kw_only=True)
class ExportOptions(ExportConfig, Options):
    """`trainwise export`: a plan as TrainingArguments (causal LMs: and TRL's SFTConfig), accelerate and DeepSpeed
    configs and a train command (ExportConfig's options, checked as it checks them, and where to write them)."""

    VERB = "export"
    out: str = option("runs/export", "Directory to write the files into.")

    def resolve(self) -> ExportConfig:
        return ExportConfig(**{f.name: getattr(self, f.name) for f in fields(ExportConfig)})


@dataclass(frozen=True, kw_only=True)
class FindBatchOptions(FindBatchConfig, spec.Lengths, spec.Data, spec.Model, Options):
    """`trainwise find-batch`: the fastest batch size that fits (the search's own options, FindBatchConfig's, checked
    as it checks them; the model, the data and the lengths a study's)."""

    VERB = "find-batch"
    strategies: str = option("baseline", "The plan: one '+' combination, e.g. bf16+grad_ckpt.")
    task: str = take(EstimateConfig, "task")  # the search skips sizes by the estimate, which models text tasks
    accum_steps: int = take(StudyConfig, "accum_steps")
    device: str = take(StudyConfig, "device")
    out: str = option("runs/find-batch", "Directory for find_batch.json / .png and the trials.")
    trial_timeout: float = take(StudyConfig, "trial_timeout")
    ray_address: str | None = take(StudyConfig, "ray_address")

    def resolve(self) -> FindBatchConfig:
        cluster.check_address(self.ray_address)
        return FindBatchConfig(**{f.name: getattr(self, f.name) for f in fields(FindBatchConfig) if f.init})

    def config_at(self, batch: int) -> StudyConfig:
        """The study of the one row at a batch size (what each probe of the search runs)."""
        return self.study_config(batch_size=batch, max_steps=self.steps, warmup_steps=1, eval_samples=0)


@dataclass(frozen=True, kw_only=True)
class TrainOptions(Training, Shape, ModelData, Priced, TrainConfig):
    """`trainwise train`: train for real with one plan (the groups ModelData, Shape, Training, Priced, TrainConfig's
    schedule, evaluation, checkpoints and early stopping, checked as it checks them, and its own machines and
    trackers)."""

    VERB = "train"
    strategies: str | None = option(None, "The plan (a+b) \\[default: baseline]; --plan: a row.")
    plan_study: str | None = option(None, "Train a study's row (advise's pick) as it ran.", "--plan")
    num_workers: int = option(0, "DataLoader worker processes.")  # one count (compare's sweeps several)
    nproc_per_node: int | None = option(None, "Several machines: ranks on each node (the same as --nproc).")
    nnodes: int | None = option(
        None, "Machines the run spans (each runs this command) \\[in srun: $SLURM_NNODES; else 1]."
    )
    node_rank: int | None = option(None, "This machine's place among them, from 0 \\[in srun: $SLURM_NODEID].")
    master_addr: str | None = option(None, "Several machines: node 0's address (static rendezvous) \\[$MASTER_ADDR].")
    master_port: int | None = option(
        None, "Several machines: a free port on node 0 \\[default: $MASTER_PORT or 29500]."
    )
    out: str = option("runs/train", "Run directory: checkpoints/, best/, train_result.json.")
    resume: bool = flag("resume", "Continue from the last whole checkpoint in --out.")
    report_to: str | None = option(
        None, "tensorboard, mlflow and/or wandb (comma list); trainwise\\[report], trainwise\\[wandb]."
    )

    def train_config(self) -> TrainConfig:
        return TrainConfig(**{f.name: getattr(self, f.name) for f in fields(TrainConfig)})

    def plan_config(self) -> StudyConfig:
        """The one-row study whose trial spec the run trains (its steps: the run's own schedule, not a study's)."""
        if self.strategies is not None and "," in self.strategies:
            raise ConfigError(f"--strategies {self.strategies!r}: train runs one plan (a '+' combination)")
        rows = [self.strategies or "baseline"]
        nproc = self.ranks_here()
        return self.study_config(
            strategies=rows, max_steps=None, warmup_steps=0, num_workers=(self.num_workers,), nproc=nproc
        )

    def ranks_here(self) -> int:
        if self.nproc_per_node is not None and self.nproc not in (1, self.nproc_per_node):
            raise ConfigError("give --nproc or --nproc-per-node (the same thing: ranks on each machine), not both")
        return self.nproc_per_node or self.nproc


@dataclass(frozen=True, kw_only=True)
class TuneOptions(ModelData, Priced, TuneConfig, spec.Lengths):
    """`trainwise tune`: search the hyper-parameters of one plan (the search's own options, TuneConfig's, checked as it
    checks them; the model, the data and the lengths a study's)."""

    VERB = "tune"
    strategies: str = option("baseline", "The plan every trial trains with.")
    batch_size: int = take(StudyConfig, "batch_size", help="Batch size when the space does not tune it.")
    eval_samples: int = take(StudyConfig, "eval_samples")
    max_train_samples: int | None = take(StudyConfig, "max_train_samples")
    device: str = take(StudyConfig, "device")
    out: str = option("runs/tune", "Study directory: tune.sqlite or pbt/, trials/, tune_result.json.")

    def resolve(self):
        """(the search's TuneConfig, the one-row StudyConfig every trial trains)."""
        tune = TuneConfig(**{f.name: getattr(self, f.name) for f in fields(TuneConfig) if f.init})
        return tune, self.study_config(strategies=[self.strategies], max_steps=None, warmup_steps=0)


@dataclass(frozen=True, kw_only=True)
class DoctorOptions(Options):
    """`trainwise doctor`: what works here."""

    VERB = "doctor"
    device: str = take(StudyConfig, "device", help="auto, cpu or cuda: the device to check.")
    out: str = option("runs/doctor", "Where the checks' trials and doctor.json are written.")


REPORT_FORMATS = ("html", "md", "csv", "json")


@dataclass(frozen=True, kw_only=True)
class ReportOptions(Options):
    """`trainwise report`: a study's reports drawn again from its results.json."""

    VERB = "report"
    study: str = option(
        help="A `trainwise compare` --out: also one killed mid-way, or one an earlier release wrote.",
        argument=True,
        metavar="STUDY",
    )
    format: str = option("html", "html (report.html, with its figures), md (report.md), csv or json (results.*).")
    output: str | None = option(None, "Where to write it (default: its file in STUDY); - prints it.")
    estimate: bool = flag(
        "estimate",
        "Also predict each row's memory with `trainwise estimate` (calibrated once per knob set, ~5-20 s each on a "
        "CPU, then cached) and draw it beside the measured (STUDY/estimates.json).",
    )

    def __post_init__(self) -> None:
        if self.format not in REPORT_FORMATS:
            raise ConfigError(f"--format must be one of {', '.join(REPORT_FORMATS)}, got {self.format!r}")


@dataclass(frozen=True, kw_only=True)
class EnvOptions(Options):
    """`trainwise env`: the environment recorded beside every figure."""

    VERB = "env"
    device: str = take(StudyConfig, "device", help="auto, cpu or cuda.")
