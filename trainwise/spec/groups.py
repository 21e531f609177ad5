"""The options a study is made of, each declared once (`option`: its help, flags and default), in the groups the
verbs share: the model and the data, the shape of a step, how a run trains, how a study measures, where its trials
run. `StudyConfig` (config.py) is these groups and its rows; a verb's options (trainwise/api/groups.py) and the other
library configs (`EstimateConfig`, `ExportConfig`) inherit the groups they read, so a field is written once.

The groups are frozen and keyword-only: a class made of several groups is built by name, in any order of bases.
A group's bases come first in its field order (`ModelData(Data, Model)` lists the model, then the data); `--help`
and a study file list the model and the data, then a verb's own options, then the groups it shares
(api/groups.py, `Options.ordered`)."""

from __future__ import annotations

from dataclasses import dataclass

from trainwise.core.config import DATASET, DEVICE, FORCE, LR, MESSAGES_COLUMN, MODEL, NPROC, PRESET, TRAIN_FILE
from trainwise.core.option import RUN, flag, option


@dataclass(frozen=True, kw_only=True)
class Model:
    """What is trained: a model (or a preset architecture) for a task."""

    model: str | None = option(None, MODEL)
    model_preset: str | None = option(None, PRESET)
    task: str = option(
        "classification",
        "classification, seq2seq, causal-lm (decoder-only LMs) or image-classification (ResNeXt; seed 003).",
    )


@dataclass(frozen=True, kw_only=True)
class Data:
    """The training data and the columns read from it."""

    dataset: str | None = option(None, DATASET)
    train_file: str | None = option(None, TRAIN_FILE)
    text_column: str | None = option(None, "Input text column of the files \\[default: text].")
    target_column: str | None = option(
        None, "Label (classification) or target text (seq2seq) column \\[default: target]."
    )
    # causal-lm: prompt/response data (the prompt carries no loss)
    prompt_column: str | None = option(
        None, "causal-lm: the prompt column of prompt/response data (no loss on it) \\[default: prompt]."
    )
    response_column: str | None = option(
        None, "causal-lm: the response column (its tokens carry the loss) \\[default: response]."
    )
    messages_column: str | None = option(None, MESSAGES_COLUMN)  # causal-lm: chat transcripts (assistant turns)


@dataclass(frozen=True, kw_only=True)
class ModelData(Data, Model):
    """The model and the data a study or a run trains, and the held-out data it is evaluated on: shown first by
    --help."""

    eval_file: str | None = option(None, "Evaluation data (default: a deterministic 10% of --train-file).")


@dataclass(frozen=True, kw_only=True)
class Batch:
    """The samples of an optimizer step and its micro-batches."""

    batch_size: int = option(16, "Effective batch size: samples per optimizer step over every rank.")
    accum_steps: int = option(4, "grad_accum: micro-batches per step (each batch/N).")


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """How many tokens an example keeps."""

    max_length: int = option(128, "Max input tokens; the baseline pads to it.")
    max_target_length: int = option(48, "Max target tokens (seq2seq).")


@dataclass(frozen=True, kw_only=True)
class Shape(Lengths, Batch):
    """What a step holds: the batch, its micro-batches, the lengths and how a long example is cut."""

    # causal-lm text and prompt/response rows: "" trainwise's own cut (a pair loses its prompt's beginning first and
    # keeps its response), or TRL's SFTTrainer's (issue 59; --from-config sets it from the file's truncation_mode)
    truncation: str = option(
        "",
        "causal-lm: cut long examples as TRL's SFTTrainer does, keep_start or keep_end (its truncation_mode; "
        "unpacked rows drop an example left with no loss token) \\[default: a pair keeps its response, losing its "
        "prompt's beginning first].",
    )


@dataclass(frozen=True, kw_only=True)
class Training:
    """How a run trains and is evaluated, whatever the verb."""

    lr: float | None = option(None, LR)  # None: DEFAULT_LR of the task
    seed: int = option(0, "Seed for weights, batches and data order.")
    device: str = option("auto", DEVICE)
    eval_samples: int = option(160, "Evaluation samples (0: no evaluation).")
    max_train_samples: int | None = option(None, "Use only the first N training rows.")
    nproc: int = option(1, NPROC)  # data-parallel processes per trial (torchrun); ZeRO rows partition over them
    force: bool = flag("force", FORCE, role=RUN)  # write into an --out that holds files trainwise did not write


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """How a study measures its rows: the trials' steps, repeats, timeouts and re-runs."""

    # None: the run's own schedule says (train's --epochs/--max-steps, tune's --max-steps), not a trial's count
    max_steps: int | None = option(16, "Optimizer steps per trial, warm-up included.")
    warmup_steps: int = option(3, "First steps excluded from timing.")
    repeat: int = option(1, "Trials per row; the table shows medians.")
    # --repeat 1: run the baseline again as the last trial (noise floor, drift)
    remeasure: bool = option(True, "With --repeat 1: the baseline again last (noise floor, drift).")
    trial_timeout: float = option(900.0, "Seconds before a trial is killed and recorded 'timeout'.", role=RUN)
    retry_failed: bool = option(False, "On resume, run again the rows that did not end 'ok'.", role=RUN)
    # a timing trial measured under load is run again up to this many times
    retries: int = option(2, "Re-runs of a trial timed under load, once quiet.", role=RUN)
    # torch.profiler Chrome trace of every trial's training steps
    profile: bool = option(False, "A torch.profiler trace of each trial's steps (adds overhead).")
    # image folders are resized to image_size x image_size
    image_size: int = option(32, "image-classification: image folders are resized to this square size.")


@dataclass(frozen=True, kw_only=True)
class Scale:
    """Where a study's trials run: nodes of a Ray cluster (StudyConfig's sweeps of batch and workers beside)."""

    # on a Ray cluster: the nodes a trial's ranks span (nodes x nproc ranks, torchrun's static rendezvous)
    nodes_per_trial: int = option(
        1, "With --ray-address: the nodes each trial spans, --nproc ranks on each (its ranks: nodes x --nproc)."
    )
    # the trials as Ray tasks on a cluster (trainwise.run.cluster); None: one at a time on this machine
    ray_address: str | None = option(
        None, "Run the trials on a Ray cluster (HOST:PORT, ray://HOST:PORT or auto), several at once.", role=RUN
    )
