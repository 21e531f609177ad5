"""A collated batch and the counts the measurements need (made by trainwise.training.data and the strategies'
collators: padding, packing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100  # the label transformers' losses skip


@dataclass
class Batch:
    """A collated batch plus the counts the measurements need."""

    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask
    labels: torch.Tensor
    n_samples: int
    real_tokens: int  # non-pad tokens (inputs + targets)
    padded_tokens: int  # positions computed on, pads included (inputs + targets)
    # what the loss averages over: samples, or non-ignored target tokens (causal-lm: labels after the shift)
    loss_items: int

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True) worker threads, so host->GPU copies can overlap."""
        return Batch(
            {k: v.pin_memory() for k, v in self.inputs.items()},
            self.labels.pin_memory(),
            self.n_samples,
            self.real_tokens,
            self.padded_tokens,
            self.loss_items,
        )

    def to(self, device: torch.device | str) -> Batch:
        non_blocking = str(device).startswith("cuda")  # (a torch.device or its name: no torch import here)
        return Batch(
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.inputs.items()},
            self.labels.to(device, non_blocking=non_blocking),
            self.n_samples,
            self.real_tokens,
            self.padded_tokens,
            self.loss_items,
        )
