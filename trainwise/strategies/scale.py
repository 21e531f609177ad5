"""DeepSpeed ZeRO: partition the training state over the data-parallel ranks (`--nproc`).

Run through Accelerate's DeepSpeed plugin, under torchrun (on CPU with DS_ACCELERATOR=cpu and gloo).
With one rank ZeRO partitions nothing; it is still a row, so its overhead shows.
"""

from __future__ import annotations

from typing import Any

from trainwise.strategies import optim
from trainwise.strategies.base import ExportDoc, Knob, MemoryTerms, Runtime, Strategy

ZERO = ("zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")
# `estimate` / `export --zero N --offload X`: the strategy those flags add to a row
FLAGS = {
    (1, "none"): "zero1",
    (2, "none"): "zero2",
    (3, "none"): "zero3",
    (2, "optimizer"): "zero2_offload",
    (3, "params"): "zero3_offload",
}
_OTHER_OPTIMIZERS = frozenset(optim.NAMES)  # offloaded ZeRO replaces the optimizer: every optimizer strategy


def _stage_runtime(value: int, rt: Runtime) -> None:
    if not value:
        return
    rt.deepspeed = {"zero_optimization": {"stage": value}}
    rt.needs_ranks = True  # DeepSpeed needs a process group, even for one rank
    rt.grads_sharded = value >= 2
    rt.zero3_init = value == 3


def _stage_export(value: int, doc: ExportDoc) -> None:
    if not value:
        return
    zero: dict = {"stage": value, "overlap_comm": True, "contiguous_gradients": True}
    if value == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    # "auto": filled in from TrainingArguments by the HF integration
    doc.ds_config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }
    doc.args["deepspeed"] = "ds_config.json"
    doc.accelerate["distributed_type"] = "DEEPSPEED"
    doc.accelerate["use_cpu"] = False
    doc.accelerate["deepspeed_config"] = {"deepspeed_config_file": "ds_config.json", "zero3_init_flag": value == 3}


def _stage_memory(value: int, terms: MemoryTerms) -> None:
    if not value:
        return
    if terms.autocast_copies:
        # DeepSpeed mixed precision: the engine holds 16-bit weights and gradients (it casts the module
        # itself, no autocast copies) and an fp32 master copy of the weights with the optimizer state
        terms.weight_bytes = terms.grad_bytes = 2
        terms.master_weights, terms.autocast_copies = True, False
    terms.optimizer_shards = terms.nproc
    if value >= 2:
        terms.grad_shards = terms.nproc
    if value >= 3:
        terms.weight_shards, terms.gathered_layers = terms.nproc, 2


ZERO_STAGE = Knob(
    "zero_stage",
    0,
    "DeepSpeed ZeRO stage: 1 partitions optimizer state, 2 + gradients, 3 + weights over the ranks (0: off)",
    _stage_runtime,
    _stage_export,
    _stage_memory,
    choices=(0, 1, 2, 3),
)


def _cpu_adam(params: list, lr: float, weight_decay: float) -> Any:
    # ZeRO-Offload steps the optimizer on the CPU: DeepSpeed's vectorised CPU Adam (a C++ op it JIT-builds
    # on first use) is the optimizer it is designed around
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    return DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay, adamw_mode=True)


def _offload_runtime(value: str, rt: Runtime) -> None:
    if value == "none":
        return
    assert rt.deepspeed is not None, "offload comes with a ZeRO stage (the zero*_offload strategies set both)"
    zero = rt.deepspeed["zero_optimization"]
    zero["offload_optimizer"] = {"device": "cpu"}
    if value == "params":
        zero["offload_param"] = {"device": "cpu"}
    rt.optimizer = _cpu_adam  # the offload strategies conflict with every other optimizer


def _offload_export(value: str, doc: ExportDoc) -> None:
    if value == "none":
        return
    assert doc.ds_config is not None, "offload comes with a ZeRO stage"
    zero = doc.ds_config["zero_optimization"]
    zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if value == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}


def _offload_memory(value: str, terms: MemoryTerms) -> None:
    terms.offload_optimizer = value in ("optimizer", "params")
    terms.offload_weights = value == "params"


OFFLOAD = Knob(
    "offload",
    "none",
    "ZeRO offload to CPU memory: the optimizer state and step, or (stage 3) the weights too",
    _offload_runtime,
    _offload_export,
    _offload_memory,
    choices=("none", "optimizer", "params"),
)

KNOBS: list[Knob] = [ZERO_STAGE, OFFLOAD]


def _zero(name: str, stage: int, offload: str, summary: str) -> Strategy:
    conflicts = frozenset(ZERO) - {name}
    if offload != "none":  # the offloaded step runs DeepSpeed's CPU Adam
        conflicts |= _OTHER_OPTIMIZERS
    return Strategy(
        name,
        summary,
        {"zero_stage": stage, "offload": offload},
        conflicts=conflicts,
        packages=frozenset({"deepspeed"}),
    )


STRATEGIES = [
    _zero("zero1", 1, "none", "ZeRO-1: optimizer state split over --nproc ranks; state memory -(N-1)/N x 8 B/param"),
    _zero("zero2", 2, "none", "ZeRO-2: + gradients split over ranks; reduce-scatter instead of all-reduce"),
    _zero("zero3", 3, "none", "ZeRO-3: + weights split, gathered layer by layer; most memory saved, most traffic"),
    _zero(
        "zero2_offload",
        2,
        "optimizer",
        "ZeRO-2 + optimizer state and step on the CPU (DeepSpeed CPU Adam); device memory down, step slower",
    ),
    _zero(
        "zero3_offload",
        3,
        "params",
        "ZeRO-3 + weights and optimizer in CPU memory; fits the largest models, slowest",
    ),
]
