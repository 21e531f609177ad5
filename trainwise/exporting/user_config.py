"""Your own training config in, the same config out (issue 59): a TRL `SFTConfig` YAML or JSON as `trl sft --config`
reads it (its ScriptArguments and ModelConfig keys beside: `model_name_or_path`, `dataset_name`...), or a
transformers `TrainingArguments` JSON (`to_json_string()`'s dump) or YAML.

- `read(path)`: the file, checked (readable, a mapping, each known field of the right type), and which class it is.
- `reading(cfg, ...)`: what the study takes from it: the model, the data, the task, the effective batch (per device x
  accumulation x processes), the length, the rate, the seed, the workers; "yours" as a row of trainwise strategies
  (each strategy's own `on_by_default` says which field turns it on, as for the ecosystem's default row), and every
  field whose effect the trials do not reproduce, named.
- `expressible(...)`: the strategies a file of this class can switch by its own fields (the search keeps to them,
  so the file trains the plan as it stands).
- `write_back(cfg, ...)`: the same file with only the plan's fields changed, and the changes in words.

The fields a strategy writes are read from its export seam (`trainwise.strategies.export_doc`): no strategy is named
here.
"""

from __future__ import annotations

import csv
import dataclasses
import enum
import json
import tempfile
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainwise import strategies
from trainwise.core.config import CAUSAL_LM
from trainwise.core.errors import ConfigError
from trainwise.core.files import write_atomic
from trainwise.exporting.arguments import RunSettings, export_doc, sft_arguments
from trainwise.search.plan_inputs import plan_of
from trainwise.strategies.knobs import TrialPlan
from trainwise.strategies.memory import ACCUM
from trainwise.training.data.sources import hub_columns

SFT, TRAINER = "sft", "trainer"
# the deprecated names transformers 5 still reads, and the field each stands for
ALIASES = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}
# what the study takes from the file (beside the strategies' own fields)
READ = {
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "seed",
    "max_length",
    "dataloader_num_workers",
    "use_cpu",
    "num_train_epochs",
    "max_steps",
    "model_name_or_path",
    "dataset_name",
    "dataset_config",
    "dataset_train_split",
    "dataset_text_field",
    "truncation_mode",
}
# fields that say where and how a run is logged, saved and evaluated: kept as written, nothing to measure
BOOKKEEPING = (
    "output_dir",
    "overwrite_output_dir",
    "logging_",
    "log_",
    "save_",
    "eval_",
    "per_device_eval_batch_size",
    "report_to",
    "run_name",
    "project",
    "trackio_",
    "push_to_hub",
    "hub_",
    "resume_from_checkpoint",
    "load_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
    "do_train",
    "do_eval",
    "do_predict",
    "disable_tqdm",
    "prediction_loss_only",
    "include_",
    "remove_unused_columns",
    "label_names",
    "ignore_data_skip",
    "skip_memory_metrics",
    "dataset_test_split",
    "dataset_streaming",
    "model_revision",
    "trust_remote_code",
    "dataset_num_proc",
    "eos_token",
    "pad_token",
    "chat_template_path",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "dataloader_drop_last",
    "data_seed",
    "ddp_",
    "local_rank",
    "average_tokens_across_devices",
    "restore_callback_states_from_checkpoint",
    "torch_empty_cache_steps",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
    "dataset_kwargs",
)


def _classes(kind: str) -> list[type]:
    """The dataclasses a file of this kind holds fields of (heavy: transformers, TRL)."""
    if kind == SFT:
        from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig  # heavy: TRL (transformers)

        return [SFTConfig, ScriptArguments, ModelConfig, DatasetMixtureConfig]
    from transformers import TrainingArguments  # heavy: transformers

    return [TrainingArguments]


@dataclass(frozen=True)
class UserConfig:
    """A user's training config as written: its class, its fields in their order, and the class's defaults."""

    path: Path
    fmt: str  # "yaml" | "json"
    kind: str  # SFT | TRAINER
    fields: dict[str, Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()  # keys no class of its kind has: kept as written, not read
    # the class's defaults as its dump writes them (`to_json_string()` after __post_init__: accelerator_config {...},
    # debug [], dataloader_pin_memory false under use_cpu): a dump's value equal to one is no choice of the user's
    dumped: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"your {'SFTConfig' if self.kind == SFT else 'TrainingArguments'} ({self.path.name})"

    def effective(self) -> dict[str, Any]:
        """Every field as the class resolves it: the file's over the defaults, each deprecated alias onto its field
        (`gradient_checkpointing: false` in the file turns off SFTConfig's default activation checkpointing)."""
        out = {**self.defaults, **self.fields}
        for old, new in ALIASES.items():
            if self.fields.get(new) is None and old in self.fields:
                out[new] = self.fields[old]
            elif out.get(new) is None and out.get(old) is not None:
                out[new] = out[old]
            out[old] = out.get(new)  # (the strategies read either name)
        if out.get("pad_to_multiple_of") == "auto":  # TRL resolves it to None (pad to the longest) but on Neuron
            out["pad_to_multiple_of"] = None
        return out


def read(path: str | Path, task: str | None = None) -> UserConfig:
    """The file, checked: readable, a mapping, each field of a known class of the type that class declares. Its kind:
    SFTConfig when `task` is causal-lm or a field only TRL's classes have is set, else TrainingArguments."""
    p = Path(path)
    where = f"--from-config {path}"
    if not p.is_file():
        raise ConfigError(f"{where}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
        raw = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        kind = "JSON" if p.suffix == ".json" else "YAML"
        raise ConfigError(f"{where}: not a readable {kind} file ({' '.join(str(e).split())[:120]})") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: expected the config's fields and values (a mapping), got {type(raw).__name__}")
    from transformers import TrainingArguments  # heavy: transformers

    plain = {f.name for f in dataclasses.fields(TrainingArguments)}
    fields_ = {str(k): v for k, v in raw.items()}
    kind = _kind(fields_, task, plain)
    if kind == SFT:
        try:
            classes = _classes(SFT)
        except ImportError:
            raise ConfigError(f"{where}: an SFTConfig needs TRL (pip install 'trainwise[sft]')") from None
    else:
        classes = _classes(TRAINER)
    defaults: dict[str, Any] = {}
    hints: dict[str, Any] = {}
    for cls in reversed(classes):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = f.default_factory()
        hints.update(typing.get_type_hints(cls))
    for name, value in fields_.items():
        if name in hints and not _accepts(value, hints[name]):
            raise ConfigError(f"{where}: {name} must be {_described(hints[name])}, got {value!r}")
    unknown = tuple(k for k in fields_ if k not in hints)
    fmt = "json" if p.suffix == ".json" else "yaml"
    return UserConfig(p, fmt, kind, fields_, defaults, unknown, _dumped(classes[0], fields_.get("use_cpu") is True))


def _dumped(cls: type, use_cpu: bool) -> dict[str, Any]:
    """`cls()`'s fields as its dump writes them (see UserConfig.dumped); none where it cannot be built here."""
    try:
        with warnings.catch_warnings(), tempfile.TemporaryDirectory() as where:
            warnings.simplefilter("ignore")
            return dict(json.loads(cls(output_dir=where, use_cpu=use_cpu).to_json_string()))
    except Exception:  # noqa: BLE001 (a class this library version builds differently: the raw defaults still hold)
        return {}


# keys a TrainingArguments user's script reads beside its arguments as TRL's do (transformers' examples name them alike)
SHARED = {"model_name_or_path", "dataset_name", "dataset_config", "dataset_config_name", "dataset_train_split"}


def _kind(fields_: Mapping[str, Any], task: str | None, plain: set[str]) -> str:
    """SFTConfig or TrainingArguments: the task where one is given; else SFTConfig where the file sets a field a
    TrainingArguments has not (beyond the model and data keys both kinds of script read), or where those keys name a
    local causal LM (its config.json's architectures); else TrainingArguments."""
    if task is not None:
        return SFT if task == CAUSAL_LM else TRAINER
    if any(k not in plain and k not in SHARED for k in fields_):
        return SFT
    if not any(k in SHARED for k in fields_):
        return TRAINER
    model = Path(str(fields_.get("model_name_or_path") or "")) / "config.json"
    try:
        architectures = json.loads(model.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return SFT  # (a hub id: TRL's scripts are the ones that read these keys from the arguments' file)
    return SFT if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures) else TRAINER


def _accepts(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if hint is Any or hint is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, str) and value in {m.value for m in hint}
    if origin in (list, tuple):
        return isinstance(value, list | tuple)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True  # (a class of its own: the library checks it when it builds the config)


def _described(hint: Any) -> str:
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "text", type(None): "null"}
    parts = typing.get_args(hint) if typing.get_origin(hint) is not None else (hint,)
    said = [names.get(p, getattr(p, "__name__", str(p))) for p in parts]
    return " or ".join(dict.fromkeys(said))


@dataclass
class Reading:
    """What a study takes from a user's config."""

    options: dict[str, Any]  # the verb's option values it sets (model, train_file, task, batch_size, lr...)
    row: str  # "yours": trainwise strategies ('grad_accum=8+grad_ckpt+chunked_ce'), or 'baseline'
    said: dict[str, str]  # strategy -> the field that turned it on
    unhonoured: list[str]  # each field whose effect the trials do not reproduce, in words
    per_device: int
    accum: int
    epochs: float | None  # the planned run: its epochs (None: max_steps says it, in steps)
    max_steps: int | None


def reading(cfg: UserConfig, device: str, valid: Callable[[str], str | None], nproc: int = 1) -> Reading:
    """The study `cfg` describes (see the module's docstring). `valid(row)`: why the registry or the device cannot
    run a row (a strategy it refuses is named, and left out of "yours")."""
    from trainwise.search import ecosystem  # the rows the library's fields turn on (no strategy named here)

    eff = cfg.effective()
    where = f"--from-config {cfg.path}"
    task = CAUSAL_LM if cfg.kind == SFT else None
    per_device, accum = eff.get("per_device_train_batch_size"), eff.get("gradient_accumulation_steps") or 1
    if not isinstance(per_device, int) or per_device < 1 or not isinstance(accum, int) or accum < 1:
        raise ConfigError(f"{where}: per_device_train_batch_size and gradient_accumulation_steps must be >= 1")
    options: dict[str, Any] = {"batch_size": per_device * accum * nproc}
    if task is not None:
        options["task"] = task
    if accum > 1:
        options["accum_steps"] = accum
    for name, option in (("learning_rate", "lr"), ("seed", "seed")):
        if eff.get(name) is not None:
            options[option] = eff[name]
    if cfg.kind == SFT and isinstance(eff.get("max_length"), int):
        options["max_length"] = eff["max_length"]
    if cfg.kind == SFT:  # the trials cut and drop long examples as `trl sft` will (its default: keep_start)
        mode = getattr(eff.get("truncation_mode"), "value", eff.get("truncation_mode")) or "keep_start"
        if mode not in ("keep_start", "keep_end"):
            raise ConfigError(f"{where}: truncation_mode must be keep_start or keep_end, not {mode!r}")
        options["truncation"] = mode
    if eff.get("dataloader_num_workers"):
        options["num_workers"] = str(eff["dataloader_num_workers"])
    if eff.get("use_cpu"):
        options["device"] = "cpu"
    if cfg.fields.get("model_name_or_path"):
        options["model"] = str(cfg.fields["model_name_or_path"])
    if cfg.fields.get("dataset_name"):
        options.update(_data(cfg, eff, where))
    found = ecosystem.build(task or "classification", device, eff, cfg.label, valid, sft=cfg.kind == SFT)
    names = [n for n in found.row.split("+") if n != "baseline"]
    if accum > 1:  # the strategy that takes the micro-batches (grad_accum), at the file's count
        names.insert(0, f"{next(s.name for s in strategies.REGISTRY.values() if s.takes == ACCUM.name)}={accum}")
    unhonoured = [*found.notes, *_unhonoured(cfg, eff)]
    epochs = None if (eff.get("max_steps") or -1) > 0 else float(eff.get("num_train_epochs") or 1.0)
    steps = int(eff["max_steps"]) if (eff.get("max_steps") or -1) > 0 else None
    return Reading(options, "+".join(names) or "baseline", found.fields, unhonoured, per_device, accum, epochs, steps)


def _data(cfg: UserConfig, eff: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The training data as the verbs read it: `dataset_name` a local .csv / .json / .jsonl file, or a folder
    holding one (its `dataset_train_split` file first); else what `datasets.load_dataset` reads, as TRL reads it (a
    hub id, from the local cache offline, with `dataset_config`; a folder of parquet files): the study's --dataset.
    And the columns TRL reads (prompt/completion, messages, or `dataset_text_field`)."""
    name = str(cfg.fields["dataset_name"])
    p = Path(name)
    if not p.is_absolute():
        p = (Path.cwd() / p) if (Path.cwd() / p).exists() else (cfg.path.parent / p)
    files: list[Path] = []
    if p.is_file():
        files = [p]
    elif p.is_dir():
        found = sorted(f for f in p.iterdir() if f.suffix in (".csv", ".json", ".jsonl"))
        split = str(eff.get("dataset_train_split") or "train")
        files = [f for f in found if f.stem == split] or found
    if len(files) > 1:
        shown = ", ".join(f.name for f in files[:3])
        raise ConfigError(f"{where}: dataset_name {name!r} holds several data files ({shown}): name one")
    out: dict[str, Any]
    if files:
        out, columns = {"train_file": str(files[0])}, _columns(files[0])
    else:  # load_dataset's: a hub id, or a folder of other files; one ConfigError line when it cannot be read
        config = eff.get("dataset_config")
        dataset = str(p if p.is_dir() else name) + (f":{config}" if config else "")
        out, columns = {"dataset": dataset}, hub_columns(dataset)
    if cfg.kind == SFT:
        if "messages" in columns:
            out["messages_column"] = "messages"
        elif "prompt" in columns and "completion" in columns:
            out["prompt_column"], out["response_column"] = "prompt", "completion"
        else:
            out["text_column"] = str(eff.get("dataset_text_field") or "text")
    return out


def _columns(path: Path) -> list[str]:
    """A data file's column names (its header, or its first record's keys)."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            if path.suffix == ".csv":
                return next(csv.reader(f), [])
            first = f.readline() if path.suffix == ".jsonl" else f.read()
            data = json.loads(first)
            record = data[0] if isinstance(data, list) and data else data
            return list(record) if isinstance(record, dict) else []
    except (OSError, ValueError, UnicodeDecodeError):
        return []


def _unhonoured(cfg: UserConfig, eff: Mapping[str, Any]) -> list[str]:
    """Each field set away from its class's default that neither the study nor a strategy reads, and that is no
    bookkeeping: the trials train without it (linear decay, no warm-up, no weight decay, their own clipping)."""
    read_by_one = {k for fields_ in strategy_fields(cfg.kind).values() for k in fields_}
    out = []
    for name, value in cfg.fields.items():
        if name in READ or name in read_by_one or name in ALIASES or name.startswith(BOOKKEEPING):
            continue
        if name in cfg.unknown:
            out.append(f"{name}: not a field of {cfg.label.split(' (')[0][5:]} here: kept as written, not read")
            continue
        default = cfg.defaults.get(name)
        if value == default or (isinstance(value, str) and value == getattr(default, "value", None)):
            continue
        if name in cfg.dumped and value == cfg.dumped[name]:
            continue
        out.append(f"{name}={value!r}: kept in the file; the trials do not reproduce it")
    return out


def settings(task: str, batch: int, max_length: int, nproc: int, device: str) -> RunSettings:
    """The export's settings for a plan of this file (the run's own values are the file's, kept as written)."""
    return RunSettings(
        model="model",
        task=task,
        batch_size=batch,
        max_length=max_length,
        max_target_length=max_length,
        lr=5e-5,
        max_steps=1,
        nproc=nproc,
        device=device,
        data_format="prompt_response" if task == CAUSAL_LM else "",
    )


def _args(kind: str, plan: TrialPlan, s: RunSettings) -> dict[str, Any]:
    doc = export_doc(plan, s)
    return sft_arguments(doc, s) if kind == SFT else dict(doc.args)


def _alone(task: str) -> list[tuple[str, TrialPlan]]:
    """Each strategy of the task with the knob values of its row alone."""
    out = []
    for name, st in strategies.REGISTRY.items():
        plan = plan_of([name], 4) if name != "baseline" and task in st.tasks else None
        if plan is not None:
            out.append((name, plan))
    return out


def strategy_fields(kind: str) -> dict[str, set[str]]:
    """Each strategy's fields in a file of this kind: the keys its export sets, changes or removes against the
    baseline's (grad_accum: the batch's two fields; grad_ckpt: activation_checkpointing...)."""
    task = CAUSAL_LM if kind == SFT else "classification"
    s = settings(task, 16, 128, 1, "cpu")
    base = _args(kind, TrialPlan(), s)
    out: dict[str, set[str]] = {}
    for name, plan in _alone(task):
        mine = _args(kind, plan, s)
        out[name] = {k for k in set(mine) | set(base) if mine.get(k, _ABSENT) != base.get(k, _ABSENT)}
    return out


_ABSENT = object()


def expressible(kind: str, task: str) -> frozenset[str]:
    """The strategies a file of this kind switches by its own fields alone: its export changes no model code, no
    model keyword, no context around training, no DeepSpeed file, and nothing it cannot write (a collator the
    library picks from its own fields counts: TRL's padding_free, the Trainer's padding collator)."""
    s = settings(task, 16, 128, 1, "cpu")
    base = export_doc(TrialPlan(), s)
    out = set()
    for name, plan in _alone(task):
        doc = export_doc(plan, s)
        if (
            doc.model_lines == base.model_lines
            and doc.model_kwargs == base.model_kwargs
            and doc.train_contexts == base.train_contexts
            and doc.ds_config == base.ds_config
            and not (doc.cannot if kind == TRAINER else {k: v for k, v in doc.cannot.items() if "sft" in k})
        ):
            out.add(name)
    return frozenset(out)


@dataclass
class Written:
    """The file written back, and each field it changed: (field, was, now)."""

    path: Path
    changes: list[tuple[str, Any, Any]]

    def line(self) -> str:
        if not self.changes:
            return "no field changed"
        return ", ".join(f"{k} {_shown(a)} -> {_shown(b)}" for k, a, b in self.changes)


def _shown(value: Any) -> str:
    if value is _ABSENT or value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(getattr(value, "value", value))


def write_back(
    cfg: UserConfig,
    plan: TrialPlan,
    batch: int,
    task: str,
    max_length: int,
    out: Path,
    nproc: int = 1,
    device: str = "cpu",
) -> Written:
    """`cfg`'s file with the plan's fields, and no other, changed, written as OUT/plan.sft.yaml (an SFTConfig) or
    OUT/plan.args.json (TrainingArguments), in the file's own format: each field the plan's export sets differently
    from what the file resolves to, under the name the file used (gradient_checkpointing stays that)."""
    s = settings(task, batch, max_length, nproc, device)
    mine, base = _args(cfg.kind, plan, s), _args(cfg.kind, TrialPlan(), s)
    eff = cfg.effective()
    touched = {k for fields_ in strategy_fields(cfg.kind).values() for k in fields_}
    new = dict(cfg.fields)
    changes: list[tuple[str, Any, Any]] = []
    # (the checkpointing's keyword arguments are the file's own: non-reentrant is what transformers 5 uses anyway)
    touched.discard("activation_checkpointing_kwargs")
    if mine.get("packing") or mine.get("padding_free"):  # rows without padding: no multiple to pad to
        touched.discard("pad_to_multiple_of")
    for key in sorted(touched, key=lambda k: (k not in cfg.fields, k)):
        if key == "pad_to_multiple_of" and key not in mine:
            want: Any = None
        else:
            want = mine.get(key, _off(base.get(key, _ABSENT), eff.get(key)))
        if want is _ABSENT:
            continue
        have = eff.get(key)
        if _same(have, want):
            continue
        # under each name the file holds it by (a dump writes both gradient_checkpointing and activation_checkpointing:
        # one left true kept the plan's run checkpointing, 2026-11-28), else under the field's own
        names = [n for n in (*(old for old, n in ALIASES.items() if n == key), key) if n in cfg.fields] or [key]
        for name in names:
            new[name] = want
        changes.append((names[0], have, want))
    suffix = ".sft" if cfg.kind == SFT else ".args"
    path = out / f"plan{suffix}.{'json' if cfg.fmt == 'json' else 'yaml'}"
    header = f"# {cfg.label} with the plan of {out} (trainwise plan --from-config): {len(changes)} field(s) changed\n"
    text = json.dumps(new, indent=2) + "\n" if cfg.fmt == "json" else header + yaml.safe_dump(new, sort_keys=False)
    write_atomic(path, text)
    return Written(path, changes)


def _off(base_value: Any, have: Any) -> Any:
    """A field the plan's export does not set: the baseline's value, else off for a switch the file turned on."""
    if base_value is not _ABSENT:
        return base_value
    return False if isinstance(have, bool) and have else _ABSENT


def _same(a: Any, b: Any) -> bool:
    return getattr(a, "value", a) == getattr(b, "value", b)
