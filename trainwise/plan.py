"""TrialPlan: the resolved knobs one trial runs with.

Strategies edit a plan (`Strategy.apply`); the training loop only reads it. Every field's default
is the vanilla baseline of the seed case studies: fp32, no accumulation, no checkpointing, AdamW,
padding to max length, random batches, nothing frozen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal

Precision = Literal["fp32", "bf16", "fp16"]
Optimizer = Literal["adamw", "adamw_foreach", "adamw_fused", "adamw_8bit", "adafactor"]
Padding = Literal["max_length", "longest"]
Sampler = Literal["random", "length_grouped", "sortish"]
Offload = Literal["none", "optimizer", "params"]
Attention = Literal["default", "sdpa", "eager"]


@dataclass(frozen=True)
class TrialPlan:
    precision: Precision = "fp32"
    accum_steps: int = 1
    grad_ckpt: bool = False
    optimizer: Optimizer = "adamw"
    padding: Padding = "max_length"
    sampler: Sampler = "random"
    freeze: tuple[str, ...] = ()
    tf32: bool = False  # CUDA: TF32 tensor-core matmuls for fp32
    lora_r: int = 0  # LoRA adapter rank on the attention projections (0: full fine-tuning)
    # DeepSpeed ZeRO: 0 = off; 1 partitions optimizer states, 2 + gradients, 3 + weights over the
    # --nproc ranks. Offload moves optimizer states ("optimizer") or also weights ("params", stage 3)
    # to CPU memory. Trials with zero_stage > 0 run under torchrun + DeepSpeed.
    zero_stage: int = 0
    offload: Offload = "none"
    attn: Attention = "default"  # attn_implementation; "default": what transformers picks for the model
    compile: bool = False  # torch.compile the model (compile time reported apart from step time)
    offload_activations: bool = False  # CUDA: keep saved activations in pinned CPU memory until backward
    empty_cache_steps: int = 0  # CUDA: torch.cuda.empty_cache() every N optimizer steps (0: never)
    freeze_layers: int = 0  # freeze the embeddings and the first N layers of the stack (-1: half of them)
    channels_last: bool = False  # images: NHWC memory format for the convolutions

    def with_(self, **changes: object) -> TrialPlan:
        return replace(self, **changes)  # type: ignore[arg-type]

    def micro_batch_size(self, batch_size: int) -> int:
        """Samples per forward pass: the effective batch split across accumulation steps."""
        assert batch_size % self.accum_steps == 0, "validated in StudyConfig"
        return batch_size // self.accum_steps

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["freeze"] = list(self.freeze)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> TrialPlan:
        d = dict(d)
        d["freeze"] = tuple(d.get("freeze", ()))  # type: ignore[arg-type]
        return cls(**d)  # type: ignore[arg-type]
