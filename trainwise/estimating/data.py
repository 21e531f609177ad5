"""What an estimate reads (its config, the options `trainwise estimate` takes) and what it takes from the user's data
(the classes, the longest sequences after truncation)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trainwise import strategies
from trainwise.core.config import CAUSAL_LM, DEVICES, TEXT_TASKS, check_lm_columns, check_nproc
from trainwise.core.errors import ConfigError
from trainwise.core.option import option, take, words
from trainwise.core.units import parse_bytes
from trainwise.estimating.shapes import terms_of
from trainwise.spec.config import StudyConfig, check_accum
from trainwise.spec.groups import Batch, Data, Lengths, Model, Training
from trainwise.strategies import Row
from trainwise.strategies.knobs import TrialPlan
from trainwise.strategies.lm import PACKING
from trainwise.strategies.scale import FLAGS, ZERO
from trainwise.training.data.chat import check_chat_template
from trainwise.training.data.sources import read_task_data, tokenizer_corpus
from trainwise.training.models import ModelSource, load_tokenizer, train_tokenizer

TEXT_TASK_HELP = "classification, seq2seq or causal-lm (decoder-only LMs)."  # the tasks the estimate models


@dataclass(frozen=True)
class DataFacts:
    """What an estimate takes from the user's data, read the way `compare` reads it: the classes, and the
    longest training sequences after truncation (what a dynamically padded batch grows to)."""

    where: str
    rows: int
    num_labels: int
    longest: int  # input tokens
    longest_target: int  # seq2seq: target tokens; causal-lm: the most tokens one example scores
    skipped: tuple[str, ...] = ()  # what reading the data left out, a line each (as compare prints it)

    @classmethod
    def read(cls, cfg: EstimateConfig, source: ModelSource) -> DataFacts:

        # heavy: trainwise.training.data.tasks loads torch
        from trainwise.training.data.tasks import (
            IGNORE_INDEX,
            encode,
        )

        data = read_task_data(
            cfg.task,
            cfg.dataset,
            cfg.train_file,
            None,
            cfg.text_column,
            cfg.target_column,
            prompt_column=cfg.prompt_column,
            response_column=cfg.response_column,
            messages_column=cfg.messages_column,
        )
        if data.data_format == "chat" and source.kind == "preset":  # as compare refuses it, before training one
            check_chat_template(None, source.display())
        train, labels = data.train, data.labels
        with tempfile.TemporaryDirectory(prefix="trainwise-estimate-") as tmp:
            if source.kind == "preset":  # compare trains the preset's tokenizer on the data: so does this
                train_tokenizer(tokenizer_corpus(train), source.ref, Path(tmp))
            tokenizer = load_tokenizer(source, tmp if source.kind == "preset" else None)
            if data.data_format == "chat":
                check_chat_template(tokenizer, source.display())
            label2id = {x: i for i, x in enumerate(labels)}
            enc = encode(train, tokenizer, cfg.task, cfg.max_length, cfg.max_target_length, label2id, data.data_format)
        # seq2seq: target token ids; causal-lm: labels aligned with the inputs, -100 where nothing is scored
        targets = [sum(y != IGNORE_INDEX for y in t) for t in enc.labels if isinstance(t, list)] or [0]
        where = cfg.train_file or cfg.dataset or ""
        return cls(where, len(train), len(labels) or 2, max(enc.lengths()), max(targets), tuple(data.notes()))

    def lengths(self, plan: TrialPlan, cfg: EstimateConfig) -> tuple[int, int]:
        """The widest batch a plan pads to: --max-length, or the longest example under dynamic padding."""
        terms = terms_of(plan, "cpu")
        if cfg.task == CAUSAL_LM:  # (width, the most tokens a row scores)
            if terms.probe.get(PACKING.name):
                return cfg.max_length, cfg.max_length  # full rows of several examples: any position may score
            width = cfg.max_length if terms.padding == "max_length" else min(self.longest, cfg.max_length)
            return width, min(self.longest_target, width)
        if terms.padding == "max_length":
            return cfg.max_length, cfg.max_target_length
        return min(self.longest, cfg.max_length), min(self.longest_target, cfg.max_target_length)


@dataclass(frozen=True, kw_only=True)
class EstimateFields(Lengths, Batch, Data):
    """`trainwise estimate`'s options, declared once, as given (the rows and the memory as text): EstimateConfig
    checks them, the verb's options (api/options.py) inherit them. The data, the batch and the lengths are a study's
    groups (trainwise/spec/groups.py), said here for one device."""

    # the plans to estimate (compare's --strategies, with the estimate's default rows): a comma text or a list
    strategies: str | list[str] | tuple[str, ...] = take(
        StudyConfig,
        "strategies",
        default=strategies.ESTIMATE_STRATEGIES,
        show_default=strategies.shown(strategies.ESTIMATE_STRATEGIES),
    )
    task: str = take(Model, "task", help=TEXT_TASK_HELP)  # the estimate models transformers
    batch_size: int = take(Batch, "batch_size", help="Effective batch size per device (per optimizer step).")
    max_length: int = take(Lengths, "max_length", help="Input tokens per sample (padding to it is assumed).")
    num_labels: int | None = option(None, "Classes of the head, without data \\[default: 2].")  # None: 2, or the data's
    nproc: int = take(Training, "nproc", help="Data-parallel ranks (ZeRO partitions over them).")
    zero: int = option(0, "Add DeepSpeed ZeRO stage 1, 2 or 3 to the plan(s) (0: as written).")
    offload: str = option("none", "With --zero: none, optimizer (stage 2) or params (stage 3) to CPU.")
    device: str = take(Training, "device", help="Device to estimate for: auto, cpu or cuda.")
    # text (24GB), parsed to bytes into EstimateConfig's `budget`
    device_memory: str | None = option(None, "Memory of one device, e.g. 24GB; adds a fits column.")


@dataclass(frozen=True, kw_only=True)
class EstimateConfig(EstimateFields):
    """One `trainwise estimate` invocation, validated once here; its rows parsed once."""

    rows: tuple[str, ...] = field(init=False)  # `strategies`, one text a row
    parsed: tuple[Row, ...] = field(init=False)
    budget: int | None = field(init=False)  # `device_memory` in bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(words(self.strategies)))
        memory = self.device_memory
        object.__setattr__(self, "budget", parse_bytes(memory, "--device-memory") if memory is not None else None)
        if self.task not in TEXT_TASKS:
            raise ConfigError(
                f"--task must be one of {', '.join(TEXT_TASKS)}, not {self.task!r} (the estimate models transformers)"
            )
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        check_nproc(self.nproc)
        for name in ("batch_size", "accum_steps", "max_length", "max_target_length"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.num_labels is not None and self.num_labels < 2:
            raise ConfigError(f"--num-labels must be >= 2, got {self.num_labels}")
        columns = (self.prompt_column, self.response_column, self.target_column, self.messages_column)
        check_lm_columns(self.task, *columns, self.text_column)
        if self.task == CAUSAL_LM:
            if self.num_labels is not None:
                raise ConfigError("--num-labels is for classification; a causal LM's head is its vocabulary")
            # a causal LM's targets are its inputs: a row scores at most --max-length tokens
            object.__setattr__(self, "max_target_length", self.max_length)
        if self.dataset and self.train_file:
            raise ConfigError("give either --dataset or --train-file, not both")
        if self.num_labels is not None and (self.dataset or self.train_file):
            raise ConfigError("--num-labels comes from the data when --dataset or --train-file is given")
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"--zero must be 0, 1, 2 or 3, not {self.zero}")
        if self.offload not in ("none", "optimizer", "params"):
            raise ConfigError(f"--offload must be none, optimizer or params, not {self.offload!r}")
        zero = None
        if self.zero or self.offload != "none":
            zero = FLAGS.get((self.zero, self.offload))
            if zero is None:
                valid = ", ".join(f"--zero {z}" + (f" --offload {o}" if o != "none" else "") for z, o in FLAGS)
                raise ConfigError(f"--zero {self.zero} --offload {self.offload}: choose one of {valid}")
        parsed = []
        for text in self.rows:
            row = strategies.parse_row(text, self.accum_steps)
            own = next((s.name for s, _ in row.parts if s.name in ZERO), None)
            if zero is not None and own is not None and own != zero:
                raise ConfigError(f"{text!r} is {own}, but --zero/--offload ask for {zero}")
            if zero is not None and own is None:
                row = strategies.parse_row(zero if row.is_baseline else f"{text}+{zero}", self.accum_steps)
            wrong = row.wrong_task(self.task)
            if wrong is not None:
                raise ConfigError(
                    f"strategy {wrong.name!r} applies to {', '.join(sorted(wrong.tasks))}, not {self.task}"
                )
            missing = [m for m in row.missing_packages() if m.startswith("peft")]  # LoRA is built (on meta)
            if missing:
                raise ConfigError(f"strategy {text!r} needs {missing[0]}")
            check_accum(row, row.batch_size or self.batch_size)  # a `row@bsN` is priced at its own batch
            parsed.append(row)
        object.__setattr__(self, "parsed", tuple(parsed))
