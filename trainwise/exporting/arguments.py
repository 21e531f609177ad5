"""A plan's run as arguments: `transformers.TrainingArguments` and TRL's `SFTConfig` keyword arguments, from every
knob's part (`trainwise.strategies.export_doc`) and the run's settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainwise import strategies
from trainwise.core.config import TrialSettings
from trainwise.spec.config import TrialSpec
from trainwise.strategies.base import ExportDoc
from trainwise.strategies.knobs import TrialPlan
from trainwise.study.origin import DataOrigin
from trainwise.training.models import (
    CAUSAL_LM,
)

BUNDLED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # trainwise resolves it to the bundled copy offline


@dataclass(frozen=True)
class RunSettings:
    """What an exported plan needs besides the plan itself."""

    model: str  # what the user passes to from_pretrained / --model (or a preset name)
    task: str
    batch_size: int  # global: samples per optimizer step over every rank
    max_length: int
    max_target_length: int
    lr: float
    max_steps: int
    seed: int = 0
    max_grad_norm: float = 1.0
    num_workers: int = 0
    nproc: int = 1
    device: str = "cuda"
    model_is_preset: bool = False
    row: str = "baseline"
    accum_steps: int = 4  # what a bare `grad_accum` in the row means
    origin: DataOrigin | None = None  # a study's data, as the user gave it
    labels: tuple[str, ...] = ()  # classification: the class names, in id order
    train_rows: str | None = None  # a study's prepared training rows (JSONL: text, target)
    epochs: int = 1  # passes `trainwise train` may make (its cap on the steps), enough for max_steps
    tokenizer_dir: str | None = None  # a preset's tokenizer, trained by a study on its data
    data_format: str = ""  # causal-lm: "text" (raw text cut into blocks), "prompt_response" or "chat"; "": not known
    # chat: sft_train.py hands TRL the conversations ('messages', assistant_only_loss=True), checked to label as
    # trainwise does (trainwise.training.data.chat.trl_labels_as_ours); False: the tokens and trainwise's labels
    chat_messages: bool = False
    truncation: str = ""  # causal-lm: "" trainwise's cut, or TRL's truncation_mode the study's trials followed

    def batch_line(self, doc: ExportDoc) -> str:
        """The batch, global and per device, said once for every file."""
        per_device = doc.args.get("per_device_train_batch_size", self.batch_size)
        accum = doc.args.get("gradient_accumulation_steps", 1)
        return (
            f"batch: {self.batch_size} samples per optimizer step in all (trainwise's --batch-size is global) = "
            f"per_device_train_batch_size {per_device} x gradient_accumulation_steps {accum} x {self.nproc} process(es)"
        )


def export_doc(plan: TrialPlan, s: RunSettings, output_dir: str = "out") -> ExportDoc:
    """The run's settings, then every knob's part: the TrainingArguments, snippet and config contents."""
    args: dict = {
        "output_dir": output_dir,
        "learning_rate": s.lr,
        "max_steps": s.max_steps,
        "lr_scheduler_type": "linear",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": s.max_grad_norm,
        "seed": s.seed,
        "dataloader_num_workers": s.num_workers,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    if s.device == "cpu":
        args["use_cpu"] = True
        # trainwise pins batches only for a GPU; the Trainer's default (True) makes torch warn on every CPU run
        args["dataloader_pin_memory"] = False
    doc = ExportDoc(s.task, s.device, s.nproc, s.batch_size, s.max_length, args)
    doc.accelerate = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": 1,
        "num_processes": s.nproc,
        "machine_rank": 0,
        "use_cpu": s.device == "cpu",
        "distributed_type": "NO",
    }
    if s.nproc > 1:
        # MULTI_GPU launches N ranks (gloo when no GPU is visible). On CPU, use_cpu / --cpu would make
        # `accelerate launch` run ONE process despite num_processes, so it is left off.
        doc.accelerate.update(distributed_type="MULTI_GPU", use_cpu=False)
    doc = strategies.export_doc(plan, doc)
    if s.task == CAUSAL_LM:  # trainwise builds a causal LM with sdpa attention unless the plan says otherwise
        doc.model_kwargs.setdefault("attn_implementation", repr("sdpa"))
    return doc


def sft_arguments(doc: ExportDoc, s: RunSettings) -> dict:
    """`trl.SFTConfig` keyword arguments: the TrainingArguments, every TRL default that differs from them said
    out loud (SFTConfig turns on activation checkpointing and bf16 unless told), the rows' length, and the loss
    over the response only for prompt/response data."""
    args = {**doc.args, "activation_checkpointing": doc.args.get("activation_checkpointing", False)}
    args["bf16"] = doc.args.get("bf16", False)
    args["max_length"] = s.max_length
    if s.data_format:  # without a study: TRL decides from the dataset's columns (prompt/completion or text)
        # a completion_mask (prompt/response, chat as tokens) says where the loss is; raw text: every token
        args["completion_only_loss"] = s.data_format == "prompt_response" or (
            s.data_format == "chat" and not s.chat_messages
        )
    if s.chat_messages:  # TRL labels the chat template's {% generation %} spans: the assistant turns
        args["assistant_only_loss"] = True
    if s.truncation:  # the study's trials cut as TRL does: TRL gets the rows as they are, and cuts them so
        args["truncation_mode"] = s.truncation
    return {**args, **doc.sft}


def training_arguments(plan: TrialPlan, s: RunSettings, output_dir: str = "out") -> dict:
    """TrainingArguments kwargs that reproduce the plan (its loop, its schedule, its optimizer)."""
    return export_doc(plan, s, output_dir).args


def named_model(s: TrialSettings) -> tuple[str, bool]:
    """How a written command names a study's model, and whether it is a size preset."""
    if s.model_label == "all-MiniLM-L6-v2":  # the bundled copy's path is this machine's venv
        return BUNDLED_HUB_ID, False
    preset = s.model_kind == "preset"
    return (s.model_label if preset else s.model_ref), preset


def epochs_for(spec: TrialSpec, max_steps: int) -> int:
    """A trial cycles its data for max_steps; train stops at --epochs: enough passes for the same steps."""
    from trainwise.training import loop  # heavy: trainwise.training.loop loads torch and transformers

    return max(1, math.ceil(max_steps / max(1, loop.steps_per_epoch(spec, spec.settings.n_train))))
