"""Typed, validated configuration below the strategies: the tasks, the options' shared help, the checks of single
values, `TrainConfig` (train's own options), the monitors, and `TrialSettings`, the resolved, serialisable part every
trial of a study shares. What names rows (`StudyConfig`, `Cell`, `TrialSpec`) parses them with the strategy registry
and lives above it, in trainwise/spec/config.py."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Literal

from trainwise.core.errors import ConfigError, check_number
from trainwise.core.option import option

CAUSAL_LM = "causal-lm"
TASKS = ("classification", "seq2seq", CAUSAL_LM, "image-classification")
TEXT_TASKS = ("classification", "seq2seq", CAUSAL_LM)
IMAGE_TASK = "image-classification"
# fine-tuning vs. from scratch
DEFAULT_LR = {"classification": 5e-5, "seq2seq": 5e-5, CAUSAL_LM: 5e-5, IMAGE_TASK: 2e-3}
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_DATASET = {  # built in
    "classification": "stdlib-topic",
    "seq2seq": "stdlib-summarize",
    CAUSAL_LM: "stdlib-instruct",
    IMAGE_TASK: "digits",
}
Task = Literal["classification", "seq2seq", "causal-lm"]

# ---- the help of the options several verbs share (one text each; StudyConfig in trainwise/spec/config.py uses them) -
MODEL = (
    "Local HF model dir or hub id (offline: a dir, or 'all-MiniLM-L6-v2' from the bundled package). "
    "Default: all-MiniLM-L6-v2 for classification, preset t5-small for seq2seq, preset smollm2-135m for causal-lm."
)
PRESET = (
    "Build an architecture from its config with random weights: t5-tiny, t5-small, t5-base, bart-tiny, bart-base, "
    "bert-tiny, minilm-l6, bert-base, distilbert-base; causal-lm: gpt2-tiny, llama-tiny, qwen2-tiny, smollm2-135m, "
    "gpt2-124m, llama-1b; image-classification: resnext-tiny (default), resnext-small, resnext29-8x16d, "
    "resnext29-8x64d."
)
DATASET = (
    "Built-in offline dataset (stdlib-topic for classification, stdlib-summarize for seq2seq, stdlib-instruct for "
    "causal-lm, digits for image-classification: the defaults) or a HF dataset name."
)
TRAIN_FILE = (
    "Training data: .csv, .json or .jsonl; image-classification: a CIFAR-10 cifar-10-batches-py directory (its "
    "pickles may hold only arrays, lists and strings) or an image folder (one sub-directory per class)."
)
MESSAGES_COLUMN = (
    "causal-lm: a column of chat transcripts (lists of role/content messages; JSON text in a CSV) rendered with "
    "the model's chat template; only the assistant turns carry loss \\[default: 'messages' when there is no 'text']."
)
ROWS_HELP = (
    "Comma list of rows; '+' combines strategies in a row (bf16+grad_ckpt); 'all' is the seed studies' All Applied "
    "row. causal-lm and image-classification default to rows of their own. See `trainwise strategies`."
)
LR = (
    "Peak learning rate (linear decay to 0) \\[default: 5e-05 (fine-tuning text), 0.002 (image-classification, "
    "from scratch)]."
)
DEVICE = (
    "auto, cpu or cuda. With auto, rows the device cannot run are recorded 'unsupported'; with an explicit device "
    "they are an error."
)
NPROC = (
    "Data-parallel processes of each trial / of the training run (torchrun; gloo on CPU, one GPU each on CUDA). "
    "--batch-size stays the global batch, split over the ranks. ZeRO plans partition over them."
)
FORCE = "Write into an --out that holds files trainwise did not write (refused otherwise)."


def check_lm_columns(
    task: str,
    prompt: str | None,
    response: str | None,
    target: str | None,
    messages: str | None = None,
    text: str | None = None,
) -> None:
    """--prompt-column/--response-column (prompt/response data) and --messages-column (chat transcripts) are
    causal-lm's, one kind of data at a time; the target is another task's."""
    if task != CAUSAL_LM and (prompt is not None or response is not None):
        flag = "--prompt-column" if prompt is not None else "--response-column"
        raise ConfigError(f"{flag} is for --task causal-lm (prompt/response data), not {task}")
    if task != CAUSAL_LM and messages is not None:
        raise ConfigError(f"--messages-column is for --task causal-lm (chat transcripts), not {task}")
    if messages is not None and (prompt is not None or response is not None or text is not None):
        other = "--text-column (raw text)" if text is not None else "--prompt-column/--response-column (pairs)"
        raise ConfigError(f"give either --messages-column (chat transcripts) or {other}, not both")
    if task == CAUSAL_LM and target is not None:
        raise ConfigError(
            "--target-column is not read by causal-lm: give --prompt-column and --response-column "
            "(prompt/response data) or --text-column (raw text)"
        )


def check_nproc(nproc: int) -> None:
    if not 1 <= nproc <= 64:
        raise ConfigError(f"--nproc must be between 1 and 64, got {nproc}")


def check_seed(seed: int) -> None:
    if not 0 <= seed < 2**32:  # what numpy's and torch's generators take
        raise ConfigError(f"--seed must be between 0 and 2**32 - 1, got {seed}")


@dataclass(frozen=True)
class TrainConfig:
    """`trainwise train`'s own options (how long, evaluation, checkpoints, early stopping), validated here,
    before torch is imported: the model, data and plan come as a StudyConfig or a study's spec."""

    epochs: int = option(1, "Passes over the training data.")
    # a cap on optimizer steps (None: epochs x steps per epoch)
    max_steps: int | None = option(None, "Stop after this many optimizer steps.")
    eval_every: int = option(50, "Evaluate every K optimizer steps (and at the end).")
    save_every: int = option(50, "Checkpoint every K optimizer steps (and at the end).")
    # early stopping: evaluations without improvement (None: off)
    patience: int | None = option(None, "Early stopping: evaluations without improvement.")
    min_delta: float = option(0.0, "Early stopping: the smallest change that counts.")
    # one of MONITORS: the metric (higher is better), or a loss (lower)
    monitor: str = option("metric", "metric (accuracy / ROUGE-L / -eval loss, maximised), eval_loss or train_loss.")
    keep_checkpoints: int = option(2, "Checkpoints kept (the last N), besides best/ and final/.")  # besides the best
    checkpoints: bool = True  # tune's trials run without them (not an option: train always writes them)

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise ConfigError(f"--epochs must be > 0, got {self.epochs}")
        if self.max_steps is not None and self.max_steps <= 0:
            raise ConfigError(f"--max-steps must be > 0, got {self.max_steps}")
        if self.eval_every <= 0 or self.save_every <= 0:
            raise ConfigError("--eval-every and --save-every must be > 0")
        if self.keep_checkpoints < 1:
            raise ConfigError(
                f"--keep-checkpoints must be >= 1 (--resume continues from the last), got {self.keep_checkpoints}"
            )
        if self.patience is not None and self.patience <= 0:
            raise ConfigError(f"--patience must be >= 1 evaluation, got {self.patience}")
        check_number("--min-delta", self.min_delta, inclusive=True)
        check_monitor(self.monitor)


# what early stopping, the best checkpoint and tune watch in an evaluation record
MONITORS = {
    "metric": "the task's metric on the held-out rows (accuracy / ROUGE-L / -eval loss), higher is better",
    "eval_loss": "the mean loss on the held-out rows, lower is better",
    "train_loss": "the mean training loss since the last evaluation, lower is better",
}


def check_monitor(monitor: str) -> None:
    if monitor == "loss":
        raise ConfigError("--monitor loss: say which, eval_loss (held-out rows) or train_loss (training batches)")
    if monitor not in MONITORS:
        raise ConfigError(f"--monitor must be one of {', '.join(MONITORS)}, not {monitor!r}")


# each text task's metric, higher is better (a causal LM's: minus its evaluation loss)
METRICS = {"classification": "accuracy", "seq2seq": "rougeL", CAUSAL_LM: "neg_eval_loss"}


def monitor_name(monitor: str, task: str) -> str:
    """'metric (neg_eval_loss)': what `--monitor metric` watches for the task."""
    return f"metric ({METRICS.get(task, 'accuracy')})" if monitor == "metric" else monitor


def maximize(monitor: str) -> bool:
    return monitor == "metric"


def monitored(record: dict, monitor: str) -> float | None:
    """The watched value in an evaluation record (None when the record has none, e.g. no held-out rows)."""
    if monitor == "metric":
        # the task's metric (METRICS): a causal LM's records also hold its answers' rougeL
        return record.get("neg_eval_loss", record.get("rougeL", record.get("accuracy")))
    return record.get(monitor)


@dataclass(frozen=True)
class Sweep:
    """Which dimensions a study sweeps (a cell's label names only those)."""

    batch_sizes: bool = False
    workers: bool = False


@dataclass(frozen=True)
class TrialSettings:
    """Resolved settings shared by every trial of a study (JSON-serialisable)."""

    task: str
    model_kind: str  # "dir" | "hub" | "preset"
    model_ref: str  # a directory, a hub id or a preset name
    model_label: str  # short name for reports
    tokenizer_dir: str | None  # set when the tokenizer was trained on the data (presets)
    data_dir: str  # holds train.jsonl / eval.jsonl / labels.json written by the study
    num_labels: int
    batch_size: int
    accum_steps: int
    max_length: int
    max_target_length: int
    warmup_steps: int
    lr: float
    seed: int
    device: str  # "cpu" | "cuda" (resolved)
    eval_samples: int
    n_train: int  # training samples in the prepared data (for epoch-time projection)
    max_grad_norm: float = 1.0
    num_workers: int = 0
    nproc: int = 1
    nnodes: int = 1  # the nodes a trial's ranks span (a Ray cluster's; nproc ranks on each)
    profile: bool = False
    # tunables (trainwise tune); compare and train use the defaults
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0  # share of the steps with a linear learning-rate warm-up
    label_smoothing: float = 0.0
    num_beams: int = 1  # seq2seq evaluation: beam search width (1: greedy)
    length_penalty: float = 1.0  # seq2seq evaluation: beam score / length**penalty
    # causal-lm: "text" (raw text cut into blocks, every token carries loss), "prompt_response" (the
    # response's tokens carry it) or "chat" (conversations: the assistant turns carry it); "" for the other tasks
    data_format: str = ""
    truncation: str = ""  # causal-lm: "" trainwise's cut, or TRL's truncation_mode (keep_start / keep_end)


# the TrialSettings fields that have defaults, with them (the others are always in a key)
SETTINGS_DEFAULTS = {f.name: f.default for f in fields(TrialSettings) if f.default is not MISSING}
