"""Every verb's options, defined once: one frozen dataclass per verb whose fields are the CLI's flags
(`max_steps` is `--max-steps`), the Python API's keyword arguments and a study file's keys, with their
defaults and help. `Options.of` is the one edge where they are checked: names (an unknown one names the
closest), types, and a `config=` YAML file whose keys are the same names (given options win over it).
The libraries' own configs (`StudyConfig`, `EstimateConfig`, ...) validate the values."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import yaml

from trainwise import quality
from trainwise.advise import Constraints
from trainwise.config import DEFAULT_LR, IMAGE_TASK, StudyConfig, TrainConfig
from trainwise.cost import resolve_price
from trainwise.errors import ConfigError, check_names
from trainwise.estimate import EstimateConfig
from trainwise.export import ExportConfig
from trainwise.files import write_atomic
from trainwise.find_batch import FindBatchConfig
from trainwise.strategies import DEFAULT_STRATEGIES, ESTIMATE_STRATEGIES, shown
from trainwise.tune import TuneConfig
from trainwise.units import parse_bytes

_STUDY: dict[str, Any] = {f.name: f.default for f in fields(StudyConfig) if f.init}  # the shared defaults
CONSTRAINTS = ("objective", "memory_budget", "max_quality_drop", "max_epoch_time", "max_epoch_cost")  # advise's
PATHS = ("out", "train_file", "eval_file", "price_file", "space", "study", "plan_study")  # absolute in a study file


def option(default: Any = dataclasses.MISSING, help: str = "", *flags: str, show_default: Any = None, **more: Any):
    """A field of a verb's options: its default, its help and (when not the field's name) its CLI flags."""
    meta = {"help": help, "flags": flags, "show_default": show_default, **more}
    return field(default=default, metadata=meta)


def flag(name: str, help: str, **more: Any) -> Any:
    """A switch that is off unless given (`--force`), with no --no- form."""
    return option(False, help, f"--{name}", **more)


# What an option is to the study already in compare's --out (its `role`). An option with none defines the
# measurement (model, data, batch, lengths, steps, device, seed, ...): another value is another study, refused
# over a study's report unless --replace. ROWS adds rows to the study; PRICE and QUALITY add to its report (a run
# that gives none keeps the study's); RUN says how this run runs, not what it measures.
ROWS, PRICE, QUALITY, RUN = "rows", "price", "quality", "run"


# ---- the help of the options several verbs share (one text each) ---------------------------------------------
MODEL = (
    "Local HF model dir or hub id (offline: a dir, or 'all-MiniLM-L6-v2' from the bundled package). "
    "Default: all-MiniLM-L6-v2 for classification, preset t5-small for seq2seq, preset smollm2-135m for causal-lm."
)
PRESET = (
    "Build an architecture from its config with random weights: t5-tiny, t5-small, t5-base, bart-tiny, bart-base, "
    "bert-tiny, minilm-l6, bert-base; causal-lm: gpt2-tiny, llama-tiny, qwen2-tiny, smollm2-135m, gpt2-124m, "
    "llama-1b; image-classification: resnext-tiny (default), resnext-small, resnext29-8x16d, resnext29-8x64d."
)
TASK = "classification, seq2seq, causal-lm (decoder-only LMs) or image-classification (ResNeXt; seed 003)."
TEXT_TASK = "classification, seq2seq or causal-lm (decoder-only LMs)."
DATASET = (
    "Built-in offline dataset (stdlib-topic for classification, stdlib-summarize for seq2seq, stdlib-instruct for "
    "causal-lm, digits for image-classification: the defaults) or a HF dataset name."
)
TRAIN_FILE = (
    "Training data: .csv, .json or .jsonl; image-classification: a CIFAR-10 cifar-10-batches-py directory (its "
    "pickles may hold only arrays, lists and strings) or an image folder (one sub-directory per class)."
)
EVAL_FILE = "Evaluation data (default: a deterministic 10% of --train-file)."
TEXT_COLUMN = "Input text column of the files \\[default: text]."
TARGET_COLUMN = "Label (classification) or target text (seq2seq) column \\[default: target]."
PROMPT_COLUMN = "causal-lm: the prompt column of prompt/response data (no loss on it) \\[default: prompt]."
RESPONSE_COLUMN = "causal-lm: the response column (its tokens carry the loss) \\[default: response]."
MESSAGES_COLUMN = (
    "causal-lm: a column of chat transcripts (lists of role/content messages; JSON text in a CSV) rendered with "
    "the model's chat template; only the assistant turns carry loss \\[default: 'messages' when there is no 'text']."
)
MAX_TRAIN_SAMPLES = "Use only the first N training rows."
ROWS_HELP = (
    "Comma list of rows; '+' combines strategies in a row (bf16+grad_ckpt); 'all' is the seed studies' All Applied "
    "row. See `trainwise strategies`."
)
PLAN = "The plan: one '+' combination, e.g. bf16+grad_ckpt."
ZERO = "Add DeepSpeed ZeRO stage 1, 2 or 3 to the plan(s) (0: as written)."
OFFLOAD = "With --zero: none, optimizer (stage 2) or params (stage 3) to CPU."
BATCH = "Effective batch size: samples per optimizer step over every rank."
ACCUM = "grad_accum: micro-batches per step (each batch/N)."
MAX_LENGTH = "Max input tokens; the baseline pads to it."
MAX_TARGET = "Max target tokens (seq2seq)."
LR = (
    "Peak learning rate (linear decay to 0) \\[default: 5e-05 (fine-tuning text), 0.002 (image-classification, "
    "from scratch)]."
)
SEED = "Seed for weights, batches and data order."
DEVICE = (
    "auto, cpu or cuda. With auto, rows the device cannot run are recorded 'unsupported'; with an explicit device "
    "they are an error."
)
EVAL_SAMPLES = "Evaluation samples (0: no evaluation)."
NPROC = (
    "Data-parallel processes of each trial / of the training run (torchrun; gloo on CPU, one GPU each on CUDA). "
    "--batch-size stays the global batch, split over the ranks. ZeRO plans partition over them."
)
TIMEOUT = "Seconds before a trial is killed and recorded 'timeout'."
FORCE = "Write into an --out that holds files trainwise did not write (refused otherwise)."
REPLACE = (
    "Run into an --out whose study was measured with other settings (refused otherwise): this run becomes its "
    "study; the report it had is kept in OUT/replaced/N/, its trials in the store."
)
MONITOR = "metric (accuracy / ROUGE-L / -eval loss, maximised), eval_loss or train_loss."


@dataclass(frozen=True, kw_only=True)
class Options:
    """What every verb's options share: checked construction from keyword arguments or a study file."""

    VERB: ClassVar[str] = ""

    @classmethod
    def of(cls, options: Mapping[str, Any] | None = None, config: str | Path | None = None) -> Any:
        """From keyword arguments (or the CLI's given flags) over a YAML study file's keys over the defaults.
        An unknown name, a value of the wrong type or an unreadable file is one ConfigError."""
        values = read_config(config, cls) if config is not None else {}
        given = dict(options or {})
        check_names(cls.VERB, given, {f.name for f in fields(cls)})
        values.update(given)
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            check_type(name, value, hints[name], f" (in {config})" if name not in given else "")
        missing = [f.name for f in fields(cls) if f.name not in values and f.default is dataclasses.MISSING]
        if missing:
            raise ConfigError(
                f"{cls.VERB}: --{missing[0].replace('_', '-')} is required (a flag, or a key of --config)"
            )
        return cls(**values)

    def study_config(self, **fixed: Any) -> StudyConfig:
        """The StudyConfig of a verb: its options named like StudyConfig fields, then the verb's own values."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in _STUDY and k not in fixed}
        if "strategies" in values:
            values["strategies"] = words(values["strategies"])
        return StudyConfig(**values, **fixed)

    def to_file(self) -> dict[str, Any]:
        """The options as a study file's keys: every one, with paths made absolute so the file reruns the
        same run from any directory."""
        once = {f.name for f in fields(self) if f.metadata.get("saved") is False}  # this run's alone (--replace)
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in once}
        own, first = set(type(self).__annotations__), set(ModelData.__annotations__)
        values = {k: values[k] for k in sorted(values, key=lambda k: (k not in first, k not in own))}  # as --help
        for name in PATHS:
            if isinstance(values.get(name), str):
                values[name] = str(Path(values[name]).resolve())
        if isinstance(values.get("model"), str) and Path(values["model"]).is_dir():
            values["model"] = str(Path(values["model"]).resolve())
        return values

    def save(self, path: Path) -> None:
        header = f"# trainwise {self.VERB} --config {path.name}: the options this run used (flags win over it)\n"
        write_atomic(path, header + yaml.safe_dump(self.to_file(), sort_keys=False))


def read_config(path: str | Path, cls: type[Options]) -> dict[str, Any]:
    """A study file: a YAML mapping of option names (`max_steps` or `max-steps`) to values."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise ConfigError(f"--config {path}: not a readable YAML file ({' '.join(str(e).split())[:120]})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: expected option names and values (a mapping), got {type(raw).__name__}")
    known = {f.name for f in fields(cls)}
    values = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"--config {path}: unknown key {key!r} for {cls.VERB}{hint}")
        values[name] = value
    return values


def _accepts(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin in (list, tuple):
        (item, *_) = typing.get_args(hint) or (Any,)
        return isinstance(value, list | tuple) and all(_accepts(v, item) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _described(hint: Any) -> str:
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "text", type(None): "nothing"}
    parts = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return " or ".join(names.get(p, "a list") for p in parts)


def check_type(name: str, value: Any, hint: Any, where: str = "") -> None:
    if not _accepts(value, hint):
        raise ConfigError(f"--{name.replace('_', '-')}{where}: expected {_described(hint)}, got {value!r}")


def words(value: str | list[str]) -> list[str]:
    return value.split(",") if isinstance(value, str) else list(value)


def ints(value: Any, option: str) -> tuple[int, ...]:
    """8,16,32 (text, a list or one number) -> (8, 16, 32), duplicates dropped; ConfigError otherwise."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list | tuple) else [value]
    try:
        values = tuple(dict.fromkeys(int(x) for x in items if str(x).strip()))
    except (TypeError, ValueError):
        raise ConfigError(f"{option} {value!r}: give whole numbers like 8,16,32") from None
    if not values:
        raise ConfigError(f"{option} {value!r}: give whole numbers like 8,16,32")
    return values


# ---- the groups of options several verbs share ----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Priced(Options):
    """Cost: a price per hour, or a SKU of the price table (trainwise.cost validates them)."""

    price_per_hour: float | None = option(
        None, "Cost: machine price in USD per hour (or --sku from the price table).", role=PRICE
    )
    sku: str | None = option(None, "Cost: a machine in the price table (built in: ND40rs_v2, seed 000).", role=PRICE)
    price_file: str | None = option(
        None, 'Cost: JSON adding/overriding SKUs: {"NAME": {"dedicated": 3.1, "low_priority": 0.6}}.', role=PRICE
    )
    low_priority: bool = flag(
        "low-priority", "Cost: the SKU's low-priority (spot) price, plus expected re-work.", role=PRICE
    )
    preemptions_per_hour: float = option(0.5, "Cost, low-priority: preemptions per hour (an assumption).", role=PRICE)

    def priced(self) -> bool:
        """Whether a price is given (a SKU, a price per hour or a price file)."""
        return any(v is not None for v in (self.price_per_hour, self.sku, self.price_file))

    def price(self, checkpoint_minutes: float = 0.0):
        values = (self.price_per_hour, self.sku, self.price_file, self.low_priority, self.preemptions_per_hour)
        return resolve_price(*values, checkpoint_minutes)


@dataclass(frozen=True, kw_only=True)
class ModelData(Options):
    """The model and the data a study or a run trains (compare, train, tune): shown first by --help."""

    model: str | None = option(None, MODEL)
    model_preset: str | None = option(None, PRESET)
    task: str = option(_STUDY["task"], TASK)
    dataset: str | None = option(None, DATASET)
    train_file: str | None = option(None, TRAIN_FILE)
    eval_file: str | None = option(None, EVAL_FILE)
    text_column: str | None = option(None, TEXT_COLUMN)
    target_column: str | None = option(None, TARGET_COLUMN)
    prompt_column: str | None = option(None, PROMPT_COLUMN)
    response_column: str | None = option(None, RESPONSE_COLUMN)
    messages_column: str | None = option(None, MESSAGES_COLUMN)


@dataclass(frozen=True, kw_only=True)
class CompareOptions(ModelData, Priced):
    """`trainwise compare`: one trial per strategy row on the same model and data. Lists may be given as
    Python lists or as the CLI's comma text."""

    VERB = "compare"
    strategies: str | list[str] = option(
        DEFAULT_STRATEGIES, ROWS_HELP, show_default=shown(DEFAULT_STRATEGIES), role=ROWS
    )
    batch_size: int = option(16, BATCH)
    accum_steps: int = option(_STUDY["accum_steps"], ACCUM)
    max_length: int = option(_STUDY["max_length"], MAX_LENGTH)
    max_target_length: int = option(_STUDY["max_target_length"], MAX_TARGET)
    max_steps: int = option(_STUDY["max_steps"], "Optimizer steps per trial, warm-up included.")
    warmup_steps: int = option(_STUDY["warmup_steps"], "First steps excluded from timing.")
    repeat: int = option(_STUDY["repeat"], "Trials per row; the table shows medians.")
    remeasure: bool = option(True, "With --repeat 1: the baseline again last (noise floor, drift).")
    lr: float | None = option(None, LR)
    seed: int = option(_STUDY["seed"], SEED)
    device: str = option("auto", DEVICE)
    out: str = option("runs/compare", "Study directory (store, reports); the same command again resumes.", role=RUN)
    trial_timeout: float = option(900.0, TIMEOUT, role=RUN)
    eval_samples: int = option(_STUDY["eval_samples"], EVAL_SAMPLES)
    max_train_samples: int | None = option(None, MAX_TRAIN_SAMPLES)
    retry_failed: bool = option(False, "On resume, run again the rows that did not end 'ok'.", role=RUN)
    retries: int = option(_STUDY["retries"], "Re-runs of a trial timed under load, once quiet.", role=RUN)
    force: bool = flag("force", FORCE, role=RUN)
    replace: bool = flag("replace", REPLACE, role=RUN, saved=False)
    batch_sizes: str | list[int] | None = option(None, "Sweep: every row at each batch size, e.g. 8,16,32,64.")
    num_workers: str | int | list[int] = option("0", "Sweep: DataLoader worker counts, e.g. 0,1,2,4,8.")
    nproc: int = option(1, NPROC)
    image_size: int = option(32, "image-classification: image folders are resized to this square size.")
    checkpoint_minutes: float = option(30.0, "Cost, low-priority: minutes between checkpoints.", role=PRICE)
    profile: bool = option(False, "A torch.profiler trace of each trial's steps (adds overhead).")
    quality_steps: int | None = option(None, "Then train the Pareto rows this long for quality.", role=QUALITY)
    seeds: int = option(2, "Quality phase: seeds per row (the spread of the verdicts).", role=QUALITY)

    def resolve(self) -> tuple[StudyConfig, Any, tuple[int, int] | None]:
        """(the StudyConfig, the price or None, (quality steps, seeds) or None), every value validated."""
        quality.check(self.quality_steps, self.seeds)
        cfg = self.study_config(
            batch_sizes=ints(self.batch_sizes, "--batch-sizes") if self.batch_sizes else (),
            num_workers=ints(self.num_workers, "--num-workers"),
        )
        return (
            cfg,
            self.price(self.checkpoint_minutes),
            (self.quality_steps, self.seeds) if self.quality_steps else None,
        )

    def measured(self) -> dict[str, Any]:
        """The options that define what the study measures (those with no `role`), each written one way, so
        that two spellings of one value compare equal (a list or comma text, a relative or absolute path, lr
        unset or the task's default); an option the study does not read is left out."""
        roles = {f.name: f.metadata.get("role") for f in fields(self)}
        values = {k: v for k, v in self.to_file().items() if roles[k] is None}
        # the batch sizes the rows run at: a sweep's, or --batch-size
        values["batch_sizes"] = ints(self.batch_sizes, "--batch-sizes") if self.batch_sizes else (self.batch_size,)
        values["num_workers"] = ints(self.num_workers, "--num-workers")
        values["lr"] = DEFAULT_LR[self.task] if self.lr is None else self.lr
        unread = {
            "batch_size": True,  # in batch_sizes
            "max_target_length": self.task != "seq2seq",
            "image_size": self.task != IMAGE_TASK,
            "remeasure": self.repeat > 1,
        }
        return {k: v for k, v in values.items() if not unread.get(k)}

    def changed(self, stored: CompareOptions) -> list[str]:
        """What differs from the study `stored` describes and would replace its report, as 'max_steps 16 → 4':
        an option that defines the measurement, a price where both give one, a quality phase where both run one."""
        old, now = stored.measured(), self.measured()
        pairs = [(k, old.get(k), now.get(k)) for k in dict.fromkeys([*old, *now])]
        if self.priced() and stored.priced():
            pairs += [(f.name, getattr(stored, f.name), getattr(self, f.name)) for f in self._of_role(PRICE)]
        if self.quality_steps is not None and stored.quality_steps is not None:
            pairs += [(f.name, getattr(stored, f.name), getattr(self, f.name)) for f in self._of_role(QUALITY)]
        return [f"{k} {_said(old)} → {_said(new)}" for k, old, new in pairs if old != new]

    def over(self, stored: CompareOptions, reported: list[str]) -> tuple[CompareOptions, list[str]]:
        """This run over the study already in its --out (`stored`, whose report has the rows `reported`), and a
        note for each thing the study keeps: its report never loses a row, a price or a quality phase that this
        run does not ask for (rows are added; --replace runs exactly what is asked)."""
        rows = [r.strip() for r in words(self.strategies)]
        reported = list(dict.fromkeys(reported))  # in the report's order, then this run's new rows
        kept = [r for r in reported if r not in rows]
        changes: dict[str, Any] = {"strategies": [*reported, *(r for r in rows if r not in reported)]} if kept else {}
        notes = []
        if kept:
            notes.append(f"{self.out} holds rows this run does not name: {', '.join(kept)}; they stay in its report")
        if stored.priced() and not self.priced():
            changes |= {f.name: getattr(stored, f.name) for f in self._of_role(PRICE)}
            notes.append(
                f"{self.out} is priced: its report stays priced ({stored.price(stored.checkpoint_minutes).label})"
            )
        if stored.quality_steps is not None and self.quality_steps is None:
            changes |= {f.name: getattr(stored, f.name) for f in self._of_role(QUALITY)}
            notes.append(
                f"{self.out} has a quality phase: it runs too (--quality-steps {stored.quality_steps}, "
                f"--seeds {stored.seeds}; its finished trials come from its store)"
            )
        return dataclasses.replace(self, **changes), [f"trainwise: note: {n}" for n in notes]

    def _of_role(self, role: str) -> list[dataclasses.Field]:
        return [f for f in fields(self) if f.metadata.get("role") == role]


def _said(value: Any) -> str:
    """An option's value as a line says it: a list as the CLI's comma text, nothing as 'none'."""
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


@dataclass(frozen=True, kw_only=True)
class AdviseOptions(Options):
    """`trainwise advise`: rank a study's rows under constraints (--run: run or resume the study first)."""

    VERB = "advise"
    study: list[str] = option(help="Study dirs: `trainwise compare` --out.", argument=True, metavar="STUDY")
    objective: str = option("time", "What to optimise: time, cost or quality.")
    memory_budget: str | None = option(None, "Largest acceptable peak memory, e.g. 11GB, 900MiB.")
    max_quality_drop: float | None = option(None, "Largest acceptable quality drop, in its units.")
    max_epoch_time: str | None = option(None, "Time budget: longest acceptable epoch, e.g. 30m, 2h.")
    max_epoch_cost: float | None = option(None, "Cost budget: USD per epoch (a priced study).")
    run: bool = flag("run", "Run (or resume) the study into STUDY first, as compare.")
    replace: bool = flag("replace", "--run: " + REPLACE, saved=False)
    model: str | None = option(None, MODEL)
    model_preset: str | None = option(None, PRESET)
    task: str = option(_STUDY["task"], TASK)
    dataset: str | None = option(None, DATASET)
    train_file: str | None = option(None, TRAIN_FILE)
    strategies: str | list[str] = option(DEFAULT_STRATEGIES, ROWS_HELP, show_default=shown(DEFAULT_STRATEGIES))
    batch_size: int = option(_STUDY["batch_size"], BATCH)
    max_length: int = option(_STUDY["max_length"], MAX_LENGTH)
    max_steps: int = option(_STUDY["max_steps"], "--run: optimizer steps per trial.")
    device: str = option("auto", DEVICE)

    def constraints(self):
        return Constraints.of({k: getattr(self, k) for k in CONSTRAINTS})

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
class EstimateOptions(Options):
    """`trainwise estimate`: each plan's peak training memory without training."""

    VERB = "estimate"
    model: str | None = option(None, MODEL)
    model_preset: str | None = option(None, PRESET)
    task: str = option("classification", TEXT_TASK)
    dataset: str | None = option(None, DATASET)
    train_file: str | None = option(None, TRAIN_FILE)
    text_column: str | None = option(None, TEXT_COLUMN)
    target_column: str | None = option(None, TARGET_COLUMN)
    prompt_column: str | None = option(None, PROMPT_COLUMN)
    response_column: str | None = option(None, RESPONSE_COLUMN)
    messages_column: str | None = option(None, MESSAGES_COLUMN)
    num_labels: int | None = option(None, "Classes of the head, without data \\[default: 2].")
    strategies: str | list[str] = option(ESTIMATE_STRATEGIES, ROWS_HELP, show_default=shown(ESTIMATE_STRATEGIES))
    batch_size: int = option(16, "Effective batch size per device (per optimizer step).")
    accum_steps: int = option(4, ACCUM)
    max_length: int = option(128, "Input tokens per sample (padding to it is assumed).")
    max_target_length: int = option(48, MAX_TARGET)
    nproc: int = option(1, "Data-parallel ranks (ZeRO partitions over them).")
    zero: int = option(0, ZERO)
    offload: str = option("none", OFFLOAD)
    device: str = option("auto", "Device to estimate for: auto, cpu or cuda.")
    device_memory: str | None = option(None, "Memory of one device, e.g. 24GB; adds a fits column.")

    def resolve(self):
        values = dataclasses.asdict(self)
        memory = values.pop("device_memory")
        for name in ("model", "model_preset", "strategies", "zero"):
            values.pop(name)
        return EstimateConfig(
            rows=tuple(words(self.strategies)),
            device_memory=parse_bytes(memory, "--device-memory") if memory is not None else None,
            zero_stage=self.zero,
            **values,
        )


@dataclass(frozen=True, kw_only=True)
class ExportOptions(Options):
    """`trainwise export`: a plan as TrainingArguments (causal LMs: and TRL's SFTConfig), accelerate and DeepSpeed
    configs and a train command."""

    VERB = "export"
    out: str = option("runs/export", "Directory to write the files into.")
    study: str | None = option(None, "Model and settings from this study; the plan: advise's pick.")
    strategies: str | None = option(None, "The plan to export, one '+' combination, e.g. bf16+grad_ckpt.")
    model: str | None = option(None, MODEL)
    model_preset: str | None = option(None, PRESET)
    task: str = option("classification", TEXT_TASK)
    batch_size: int = option(16, BATCH)
    accum_steps: int = option(4, ACCUM)
    max_length: int = option(128, MAX_LENGTH)
    max_target_length: int = option(48, MAX_TARGET)
    lr: float = option(5e-5, "Peak learning rate (linear decay).")
    max_steps: int | None = option(None, "Steps of the exported run \\[default: the study's, else 1000].")
    nproc: int | None = option(None, "Data-parallel ranks \\[default: the study's, else 1].")
    zero: int = option(0, ZERO)
    offload: str = option("none", OFFLOAD)
    device: str = option("cuda", "Where the exported run trains: cuda or cpu.")
    force: bool = flag("force", FORCE)

    def resolve(self):
        values = dataclasses.asdict(self)
        return ExportConfig(**{f.name: values[f.name] for f in fields(ExportConfig) if f.name in values})


@dataclass(frozen=True, kw_only=True)
class FindBatchOptions(Options):
    """`trainwise find-batch`: the fastest batch size that fits."""

    VERB = "find-batch"
    strategies: str = option("baseline", PLAN)
    model: str | None = option(None, MODEL)
    model_preset: str | None = option(None, PRESET)
    task: str = option("classification", TEXT_TASK)
    dataset: str | None = option(None, DATASET)
    train_file: str | None = option(None, TRAIN_FILE)
    text_column: str | None = option(None, TEXT_COLUMN)
    target_column: str | None = option(None, TARGET_COLUMN)
    prompt_column: str | None = option(None, PROMPT_COLUMN)
    response_column: str | None = option(None, RESPONSE_COLUMN)
    messages_column: str | None = option(None, MESSAGES_COLUMN)
    candidates: str = option("4,8,16,32,64,128", "Batch sizes to try, ascending (comma list).")
    accum_steps: int = option(4, ACCUM)
    max_length: int = option(128, MAX_LENGTH)
    max_target_length: int = option(48, MAX_TARGET)
    steps: int = option(4, "Optimizer steps per size, the first untimed.")
    memory_limit: str | None = option(None, "Fit limit, e.g. 8GB (default: the device's, or RAM - 10%).")
    refine: int = option(2, "Bisection steps between the largest fit and the first failure.")
    use_estimate: bool = option(True, "Skip sizes the estimate rules out.", "--estimate/--no-estimate")
    device: str = option("auto", DEVICE)
    out: str = option("runs/find-batch", "Directory for find_batch.json / .png and the trials.")
    trial_timeout: float = option(900.0, TIMEOUT)

    def resolve(self):
        limit = parse_bytes(self.memory_limit, "--memory-limit") if self.memory_limit is not None else None
        return FindBatchConfig(self.candidates, self.steps, limit, self.refine, self.use_estimate)

    def config_at(self, batch: int) -> StudyConfig:
        """The study of the one row at a batch size (what each probe of the search runs)."""
        return self.study_config(batch_size=batch, max_steps=self.steps, warmup_steps=1, eval_samples=0)


@dataclass(frozen=True, kw_only=True)
class TrainOptions(ModelData, Priced):
    """`trainwise train`: train for real with one plan."""

    VERB = "train"
    strategies: str | None = option(None, "The plan (a+b) \\[default: baseline]; --plan: a row.")
    plan_study: str | None = option(None, "Train a study's row (advise's pick) as it ran.", "--plan")
    batch_size: int = option(_STUDY["batch_size"], BATCH)
    accum_steps: int = option(_STUDY["accum_steps"], ACCUM)
    max_length: int = option(_STUDY["max_length"], MAX_LENGTH)
    max_target_length: int = option(_STUDY["max_target_length"], MAX_TARGET)
    lr: float | None = option(None, LR)
    seed: int = option(_STUDY["seed"], SEED)
    device: str = option("auto", DEVICE)
    num_workers: int = option(0, "DataLoader worker processes.")
    epochs: int = option(1, "Passes over the training data.")
    max_steps: int | None = option(None, "Stop after this many optimizer steps.")
    eval_every: int = option(50, "Evaluate every K optimizer steps (and at the end).")
    save_every: int = option(50, "Checkpoint every K optimizer steps (and at the end).")
    keep_checkpoints: int = option(2, "Checkpoints kept (the last N), besides best/ and final/.")
    patience: int | None = option(None, "Early stopping: evaluations without improvement.")
    min_delta: float = option(0.0, "Early stopping: the smallest change that counts.")
    monitor: str = option("metric", MONITOR)
    eval_samples: int = option(_STUDY["eval_samples"], EVAL_SAMPLES)
    max_train_samples: int | None = option(None, MAX_TRAIN_SAMPLES)
    nproc: int = option(1, NPROC)
    out: str = option("runs/train", "Run directory: checkpoints/, best/, train_result.json.")
    force: bool = flag("force", FORCE)
    resume: bool = flag("resume", "Continue from the last whole checkpoint in --out.")
    report_to: str | None = option(None, "tensorboard and/or mlflow (comma list); trainwise\\[report].")

    def train_config(self):
        values = (self.epochs, self.max_steps, self.eval_every, self.save_every, self.patience, self.min_delta)
        return TrainConfig(*values, self.monitor, self.keep_checkpoints)

    def plan_config(self) -> StudyConfig:
        """The one-row study whose trial spec the run trains (max_steps: a placeholder, the run's own
        schedule replaces it)."""
        if self.strategies is not None and "," in self.strategies:
            raise ConfigError(f"--strategies {self.strategies!r}: train runs one plan (a '+' combination)")
        rows = [self.strategies or "baseline"]
        return self.study_config(strategies=rows, max_steps=2, warmup_steps=0, num_workers=(self.num_workers,))


@dataclass(frozen=True, kw_only=True)
class TuneOptions(ModelData, Priced):
    """`trainwise tune`: search the hyper-parameters of one plan."""

    VERB = "tune"
    space: str = option(help="Search space, YAML: lr: {low: 1e-5, high: 1e-3, log: true} ...")
    search: str = option("tpe", "random or tpe (Optuna, pruning), or pbt (Ray Tune; trainwise\\[ray]).")
    trials: int = option(8, "random/tpe: finished trials to reach; pbt: the population.")
    strategies: str = option("baseline", "The plan every trial trains with.")
    batch_size: int = option(_STUDY["batch_size"], "Batch size when the space does not tune it.")
    max_length: int = option(_STUDY["max_length"], MAX_LENGTH)
    max_steps: int = option(60, "Optimizer steps per trial (the budget unit).")
    eval_every: int = option(20, "Evaluate (and maybe prune) every K steps.")
    monitor: str = option("metric", "metric (maximised), eval_loss or train_loss (minimised).")
    eval_samples: int = option(_STUDY["eval_samples"], EVAL_SAMPLES)
    max_train_samples: int | None = option(None, MAX_TRAIN_SAMPLES)
    seed: int = option(_STUDY["seed"], SEED)
    device: str = option("auto", DEVICE)
    out: str = option("runs/tune", "Study directory: tune.sqlite or pbt/, trials/, tune_result.json.")
    ray_address: str | None = option(None, "pbt: a Ray cluster (ray://head:10001 or auto).")
    cpus_per_trial: float | None = option(None, "pbt: CPUs per member (default: cores / population).")
    trial_timeout: float = option(900.0, "random/tpe: seconds before a trial is killed ('timeout').")

    def resolve(self):
        """(the search's TuneConfig, the one-row StudyConfig every trial trains)."""
        values = dataclasses.asdict(self)
        tune = TuneConfig(**{f.name: values[f.name] for f in fields(TuneConfig) if f.init})
        return tune, self.study_config(strategies=[self.strategies], max_steps=2, warmup_steps=0)


@dataclass(frozen=True, kw_only=True)
class DoctorOptions(Options):
    """`trainwise doctor`: what works here."""

    VERB = "doctor"
    device: str = option("auto", "auto, cpu or cuda: the device to check.")
    out: str = option("runs/doctor", "Where the checks' trials and doctor.json are written.")


@dataclass(frozen=True, kw_only=True)
class EnvOptions(Options):
    """`trainwise env`: the environment recorded beside every figure."""

    VERB = "env"
    device: str = option("auto", "auto, cpu or cuda.")
