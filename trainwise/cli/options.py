"""Option definitions shared by the verbs: one definition per option, with its help.

A verb's parameters are named like the fields of the config they fill (`StudyConfig` for the model, the
data and the run), so `study_config(ctx.params, ...)` builds that config in one place.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any

import typer

from trainwise import strategies as catalogue
from trainwise.config import StudyConfig

_D = {f.name: f.default for f in fields(StudyConfig) if f.init}  # CLI defaults come from StudyConfig


def default(name: str) -> Any:
    return _D[name]


def study_config(params: dict[str, Any], **fixed: Any) -> StudyConfig:
    """The StudyConfig of a verb: its options named like StudyConfig fields, then the verb's own values."""
    values = {k: v for k, v in params.items() if k in _D and k not in fixed}
    if isinstance(values.get("strategies"), str):
        values["strategies"] = values["strategies"].split(",")
    return StudyConfig(**values, **fixed)


def price(params: dict[str, Any], checkpoint_minutes: float = 30.0):
    from trainwise.cost import resolve_price

    return resolve_price(
        params["price_per_hour"],
        params["sku"],
        params["price_file"],
        params["low_priority"],
        params["preemptions_per_hour"],
        params.get("checkpoint_minutes", checkpoint_minutes),
    )


# ---- model and data ----------------------------------------------------------------------------------------
Model = Annotated[
    str | None,
    typer.Option(
        help="Local HF model dir or hub id (offline: a dir, or 'all-MiniLM-L6-v2' from the bundled package). "
        "Default: all-MiniLM-L6-v2 for classification, preset t5-small for seq2seq."
    ),
]
Preset = Annotated[
    str | None,
    typer.Option(
        help="Build an architecture from its config with random weights: t5-tiny, t5-small, t5-base, bart-tiny, "
        "bart-base, bert-tiny, minilm-l6, bert-base; image-classification: resnext-tiny (default), resnext-small, "
        "resnext29-8x16d, resnext29-8x64d."
    ),
]
Task = Annotated[str, typer.Option(help="classification, seq2seq or image-classification (ResNeXt; seed 003).")]
TextTask = Annotated[str, typer.Option(help="classification or seq2seq.")]
Dataset = Annotated[
    str | None,
    typer.Option(
        help="Built-in offline dataset (stdlib-topic for classification, stdlib-summarize for seq2seq, digits for "
        "image-classification: the defaults) or a HF dataset name."
    ),
]
TrainFile = Annotated[
    str | None,
    typer.Option(
        help="Training data: .csv, .json or .jsonl; image-classification: a CIFAR-10 cifar-10-batches-py directory "
        "(its pickles may hold only arrays, lists and strings) or an image folder (one sub-directory per class)."
    ),
]
EvalFile = Annotated[str | None, typer.Option(help="Evaluation data (default: a deterministic 10% of --train-file).")]
TextColumn = Annotated[str | None, typer.Option(help="Input text column of the files \\[default: text].")]
TargetColumn = Annotated[
    str | None, typer.Option(help="Label (classification) or target text (seq2seq) column \\[default: target].")
]
MaxTrainSamples = Annotated[int | None, typer.Option(help="Use only the first N training rows.")]
ImageSize = Annotated[int, typer.Option(help="image-classification: image folders are resized to this square size.")]

# ---- the run -----------------------------------------------------------------------------------------------
ROWS = (
    "Comma list of rows; '+' combines strategies in a row (bf16+grad_ckpt); 'all' is the seed studies' All Applied "
    "row. See `trainwise strategies`."
)
Rows = Annotated[str, typer.Option(help=ROWS, show_default=catalogue.shown(catalogue.DEFAULT_STRATEGIES))]
EstimateRows = Annotated[str, typer.Option(help=ROWS, show_default=catalogue.shown(catalogue.ESTIMATE_STRATEGIES))]
Plan = Annotated[str, typer.Option(help="The plan: one '+' combination, e.g. bf16+grad_ckpt.")]
Zero = Annotated[int, typer.Option(help="Add DeepSpeed ZeRO stage 1, 2 or 3 to the plan(s) (0: as written).")]
Offload = Annotated[str, typer.Option(help="With --zero: none, optimizer (stage 2) or params (stage 3) to CPU.")]
BatchSize = Annotated[int, typer.Option(help="Effective batch size: samples per optimizer step over every rank.")]
AccumSteps = Annotated[int, typer.Option(help="grad_accum: micro-batches per step (each batch/N).")]
MaxLength = Annotated[int, typer.Option(help="Max input tokens; the baseline pads to it.")]
MaxTargetLength = Annotated[int, typer.Option(help="Max target tokens (seq2seq).")]
Lr = Annotated[
    float | None,
    typer.Option(
        help="Peak learning rate (linear decay to 0) \\[default: 5e-05 (fine-tuning text), 0.002 "
        "(image-classification, from scratch)]."
    ),
]
Seed = Annotated[int, typer.Option(help="Seed for weights, batches and data order.")]
Device = Annotated[
    str,
    typer.Option(
        help="auto, cpu or cuda. With auto, rows the device cannot run are recorded 'unsupported'; with an explicit "
        "device they are an error."
    ),
]
EvalSamples = Annotated[int, typer.Option(help="Evaluation samples (0: no evaluation).")]
Nproc = Annotated[
    int,
    typer.Option(
        help="Data-parallel processes of each trial / of the training run (torchrun; gloo on CPU, one GPU each on "
        "CUDA). --batch-size stays the global batch, split over the ranks. ZeRO plans partition over them."
    ),
]
TrialTimeout = Annotated[float, typer.Option(help="Seconds before a trial is killed and recorded 'timeout'.")]

# ---- cost (compare, train, tune; trainwise.cost validates them) ------------------------------------------------
PricePerHour = Annotated[
    float | None, typer.Option(help="Cost: machine price in USD per hour (or --sku from the price table).")
]
Sku = Annotated[str | None, typer.Option(help="Cost: a machine in the price table (built in: ND40rs_v2, seed 000).")]
PriceFile = Annotated[
    str | None,
    typer.Option(help='Cost: JSON adding/overriding SKUs: {"NAME": {"dedicated": 3.1, "low_priority": 0.6}}.'),
]
LowPriority = Annotated[
    bool, typer.Option("--low-priority", help="Cost: the SKU's low-priority (spot) price, plus expected re-work.")
]
Preemptions = Annotated[float, typer.Option(help="Cost, low-priority: preemptions per hour (an assumption).")]
Force = Annotated[
    bool,
    typer.Option("--force", help="Write into an --out that holds files trainwise did not write (refused otherwise)."),
]
