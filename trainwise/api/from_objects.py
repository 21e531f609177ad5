"""`trainwise.plan(trainer=...)`, or `trainwise.plan(model=..., train_dataset=..., processing_class=..., args=...)`
(issue 59): the objects a notebook or a script holds, planned as `--from-config` plans a file.

- The objects are saved once into the study, OUT/yours/: the model and its tokenizer (`save_pretrained`), the
  training data as JSON lines, the arguments as the JSON `--from-config` reads (their `model_name_or_path` and
  `dataset_name` pointing at the two). Every trial process loads them as it loads any local model and data file: no
  copy per trial, and a study that resumes, reports, exports and trains like any other.
- The plan comes back as objects of the user's own classes: `result.args`, a new `TrainingArguments` / `SFTConfig`
  of the class given with only the plan's fields changed, and `result.data_collator` where the plan needs a collator
  the arguments cannot say: None for an SFTTrainer, which builds its collator from the new SFTConfig (packing,
  padding-free), the Trainer's own for a Trainer (no strategy its arguments switch needs another).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.api import from_config
from trainwise.api.options import CompareOptions, EstimateOptions, PlanOptions, words
from trainwise.core.errors import ConfigError
from trainwise.core.files import write_atomic
from trainwise.exporting.user_config import ALIASES

YOURS = from_config.SAVED_OBJECTS  # OUT/yours/: the saved objects
TEXT_COLUMNS = ({"messages"}, {"prompt", "completion"}, {"text"})  # what TRL reads, in its order


SECRET_TOKENS = ("hub_token", "push_to_hub_token")  # an arguments object's credentials: never written


@dataclass
class Objects:
    """What the user handed over."""

    model: Any
    train_dataset: Any
    processing_class: Any
    args: Any
    data_collator: Any = None

    @classmethod
    def of(
        cls,
        trainer: Any = None,
        model: Any = None,
        train_dataset: Any = None,
        processing_class: Any = None,
        args: Any = None,
    ) -> Objects | None:
        """From a Trainer / SFTTrainer, or from its parts (a part given beside a trainer wins); None where neither
        (`model` as a string is the option --model, a hub id or a folder, not an object)."""
        if trainer is None and (model is None or isinstance(model, str | Path)):
            if train_dataset is not None or args is not None:
                raise ConfigError("train_dataset= and args= come with model= (a model object) or trainer=")
            return None
        if trainer is not None:
            if not all(hasattr(trainer, a) for a in ("model", "args", "train_dataset")):
                raise ConfigError(f"trainer=: a {type(trainer).__name__} is no transformers Trainer or SFTTrainer")
            model = model if model is not None else trainer.model
            train_dataset = train_dataset if train_dataset is not None else trainer.train_dataset
            processing_class = processing_class or getattr(trainer, "processing_class", None)
            args = args if args is not None else trainer.args
            collator = getattr(trainer, "data_collator", None)
        else:
            collator = None
        found = cls(model, train_dataset, processing_class, args, collator)
        found.check()
        return found

    def check(self) -> None:
        from transformers import PreTrainedModel, TrainingArguments  # heavy: transformers

        model = self.model
        if not isinstance(model, PreTrainedModel):
            kind = type(model).__name__
            if hasattr(model, "peft_config"):
                raise ConfigError(
                    f"model: a {kind} (PEFT): pass its base model and measure LoRA with --strategies lora / qlora"
                )
            raise ConfigError(f"model: a {kind} is not a transformers PreTrainedModel trainwise can measure")
        if self.args is None:
            raise ConfigError("args= is required with model= (your TrainingArguments or SFTConfig)")
        if not isinstance(self.args, TrainingArguments):
            raise ConfigError(f"args: a {type(self.args).__name__} is no TrainingArguments or SFTConfig")
        if self.processing_class is None:
            raise ConfigError("processing_class= (the tokenizer) is required with model=")
        columns = getattr(self.train_dataset, "column_names", None)
        if not isinstance(columns, list) or not hasattr(self.train_dataset, "to_json"):
            raise ConfigError(
                "train_dataset: expected a datasets.Dataset (an IterableDataset or a torch Dataset is "
                "not saved into the study: save it as a CSV or JSON lines file and use --from-config)"
            )

    @property
    def sft(self) -> bool:
        return any(c.__name__ == "SFTConfig" for c in type(self.args).__mro__)

    def save(self, out: Path, weights: bool = True) -> Path:
        """The objects into OUT/yours/ (see the module's docstring); the arguments' file, for --from-config.
        `weights=False`: the model's config alone (an estimate reads the shapes, never the weights)."""
        where = out / YOURS
        model_dir, data = where / "model", where / "train.jsonl"
        columns = set(self.train_dataset.column_names)
        if self.sft and not any(c <= columns for c in TEXT_COLUMNS):
            field = getattr(self.args, "dataset_text_field", "text")
            if field not in columns:
                raise ConfigError(
                    f"train_dataset: no column TRL reads (messages, prompt and completion, or {field!r}); it has "
                    f"{sorted(columns)[:6]} (trainwise tokenises the text itself: pass the dataset before tokenising)"
                )
        if not self.sft and "input_ids" in columns and not columns - {"input_ids", "attention_mask", "labels",
                                                                    "label", "token_type_ids"}:  # fmt: skip
            raise ConfigError(
                "train_dataset: tokenised only (input_ids, labels): trainwise tokenises the text itself: pass the "
                "dataset with its text and label columns"
            )
        where.mkdir(parents=True, exist_ok=True)
        if weights:
            self.model.save_pretrained(model_dir)
        else:
            self.model.config.save_pretrained(model_dir)
        self.processing_class.save_pretrained(model_dir)
        self.train_dataset.to_json(str(data), lines=True, force_ascii=False)
        fields = {**arguments_file(self.args), "model_name_or_path": str(model_dir), "dataset_name": str(data)}
        path = where / "args.json"
        write_atomic(path, json.dumps(fields, indent=2, default=str) + "\n")
        return path

    def answer(self, changes: list[list[Any]], plan: str | None) -> tuple[Any, Any]:
        """The plan as the user's objects: a new arguments object of their class with each changed field (and its
        newer name, where the file used the old one), and the collator the plan needs."""
        if not plan:
            return self.args, None if self.sft else self.data_collator
        new: dict[str, Any] = {}
        for name, _was, now in changes:
            new[name] = now
            if name in ALIASES:
                new[ALIASES[name]] = now
        known = {f.name for f in dataclasses.fields(self.args) if f.init}
        args = dataclasses.replace(self.args, **{k: v for k, v in new.items() if k in known})
        # (TRL builds its collator from the arguments: the trainer's own was built for the old ones; a Trainer's
        # collator pads as the plan's rows do: no strategy a TrainingArguments file switches needs another)
        return args, None if self.sft else self.data_collator


def arguments_file(args: Any) -> dict[str, Any]:
    """An arguments object (TrainingArguments, SFTConfig) as the file its parser reads back to the same values (tests:
    an SFTConfig of nested dicts, a dtype, tokens and lists, field for field through `trl sft`'s parser). to_dict masks
    every field named *_token ("<EOS_TOKEN>"), which TRL would read as the token itself: the real value, except the
    hub's secrets, which no file of a study keeps. (On a copy: to_dict turns a nested dtype into its name in place.)"""
    fields = {k: v for k, v in copy.deepcopy(args).to_dict().items() if not k.startswith("_")}
    for k, v in list(fields.items()):
        if k.endswith("_token") and v == f"<{k.upper()}>":
            fields[k] = None if k in SECRET_TOKENS else getattr(args, k, None)
    return fields


OBJECT_KEYS = ("trainer", "train_dataset", "processing_class", "tokenizer", "args")


def pop_objects(options: dict[str, Any]) -> Objects | None:
    """The objects among a call's keyword arguments (taken out of them; `tokenizer` is `processing_class`'s older
    name), or None where there are none."""
    given = {k: options.pop(k) for k in OBJECT_KEYS if k in options}
    model = options.get("model")
    processing_class = given.pop("processing_class", None) or given.pop("tokenizer", None)
    found = Objects.of(given.get("trainer"), model, given.get("train_dataset"), processing_class, given.get("args"))
    if found is not None and not isinstance(model, str | Path):
        options.pop("model", None)
    if found is not None and options.get("from_config"):
        raise ConfigError("from_config= or your objects (trainer=, or model= with args=), not both")
    return found


def plan(found: Objects, options: dict[str, Any], config: str | Path | None, render: Any, start: Any) -> Any:
    """The plan of the objects: saved into the study, planned as --from-config plans their file, answered as
    objects (`result.args`, `result.data_collator`). `start`: the verb's (`trainwise.api.plan.start`)."""
    chosen = PlanOptions.of(options, config)
    path = _saved(found, Path(chosen.out), chosen.force)
    result = start(dataclasses.replace(chosen, from_config=str(path)), render, given=set(options), objects=True)
    result.args, result.data_collator = found.answer((result.yours or {}).get("changes", []), result.plan)
    return result


def compare(found: Objects, options: dict[str, Any], config: str | Path | None, render: Any, start: Any) -> Any:
    """A study of the objects: saved into it as for a plan, its settings the arguments' (a keyword given wins), its
    rows the verb's defaults and yours (the arguments' own strategies). `start`: `trainwise.api.compare.start`."""
    chosen = CompareOptions.of(options, config)
    path = _saved(found, Path(chosen.out), chosen.force)
    new, row, _unhonoured = from_config.settings(chosen, str(path), set(options))  # (the study's report says them)
    if "strategies" not in options and row not in words(new.strategies):
        new = dataclasses.replace(new, strategies=",".join([*words(new.strategies), row]))
    return start(new, render)


def estimate(found: Objects, options: dict[str, Any], config: str | Path | None, render: Any, start: Any) -> Any:
    """The memory estimate of the objects: the model's config (not its weights), tokenizer, data and arguments
    saved into a folder of their own for the call, read as `compare` reads them; the rows: the baseline and yours,
    unless strategies= names them. `start`: `trainwise.api.estimate.start`."""
    chosen = EstimateOptions.of(options, config)
    with tempfile.TemporaryDirectory(prefix="trainwise-estimate-") as where:
        path = found.save(Path(where), weights=False)
        # the device is the estimate's target (a GPU, estimated on a machine without one), not this machine's
        new, row, unhonoured = from_config.settings(chosen, str(path), set(options), probe=False)
        if "strategies" not in options:
            new = dataclasses.replace(new, strategies=",".join(dict.fromkeys(["baseline", row])))
        report = start(new, render)
    # named by the model's own name, not the folder it was saved into for the call; the fields yours leaves out, said
    name = getattr(getattr(found.model, "config", None), "name_or_path", "") or report.model
    said = [f"your arguments: {line}" for line in unhonoured]
    return dataclasses.replace(report, model=str(name), notes=[*report.notes, *said])


def _saved(found: Objects, out: Path, force: bool) -> Path:
    """The objects saved into the study at `out` (refused where `out` holds files that are no study's)."""
    from trainwise.study.store import check_ours, mark  # heavy: the study store

    check_ours(out, force)  # (an --out of the user's files is refused before anything is written into it)
    out.mkdir(parents=True, exist_ok=True)
    mark(out)
    return found.save(out)
