"""Packing for causal-LM fine-tuning: several examples share one row of `block` tokens, none attends to another.

How transformers 5.23 keeps packed examples apart (read in `transformers/masking_utils.py`):
`_preprocess_mask_arguments` calls `find_packed_sequence_indices(position_ids)` only when the 2D
`attention_mask` is None AND there is no `past_key_values`. That function starts a new sequence wherever
two neighbouring position ids do not differ by exactly 1 (`(diff(position_ids) != 1).cumsum(-1)`), and
`create_causal_mask` then ANDs the causal mask with "same sequence" (`packed_sequence_compatibility_function`),
for sdpa, eager and flex attention alike. It returns None (plain causal, the fast `is_causal` path) when no row
holds more than one sequence. So a packed batch must carry position ids restarting at 0 for each example and
NO attention mask, and the forward must run without a cache: set `model.config.use_cache = False`, since
transformers builds a cache in train mode too when the config asks for one (its default). With a cache, or an
all-ones attention mask, the examples silently attend to each other (tests/strategies/test_packing.py shows all three).

Flash attention takes another road (`modeling_flash_attention_utils._is_packed_sequence`): it only unpacks
position ids when the batch is ONE row, so [rows, block] packed batches would cross examples there; `can_pack`
says so. Some families build positions or masks their own way (OPT derives positions from the attention mask,
Bloom and Falcon use ALiBi from the mask) and cross examples silently; `can_pack` names the families verified.

Labels: HF causal LMs shift labels inside the loss (`ForCausalLMLoss`: logits at position i are scored
against labels[i + 1]). In a packed row the logits at an example's LAST token would be scored against the NEXT
example's first token, a prediction across the boundary from a context that (correctly) cannot see it. So the
label at each example's first position is set to -100. Run alone, that label is never scored either (nothing
precedes it), so a packed batch's loss is exactly the token-weighted mean of its examples' losses alone.

Padding at the end of a row: pad id, label -100, and position ids CONTINUING the row's last example. The
last example's tokens never see the pads (causal), the pads' outputs are never scored, and a batch whose rows
each hold a single example stays "not packed" for transformers, keeping sdpa's fast causal path.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from trainwise.core.batch import IGNORE_INDEX, Batch

Example = tuple[list[int], list[int]]  # (input_ids, labels aligned with them, -100 where no loss)

# model_type -> checked: a packed example's logits equal the example run alone (sdpa and eager),
# tests/strategies/test_packing.py
PACKABLE = frozenset(
    {"gpt2", "llama", "qwen2", "qwen3", "mistral", "gemma", "phi", "phi3", "gpt_neox", "gpt_bigcode", "gptj"}
)
# model_type -> why the examples of a packed row would see each other (measured with transformers 5.23)
CROSSES = {
    "opt": "OPT derives positions from the attention mask, so packed examples attend to each other",
    "bloom": "Bloom's ALiBi bias and mask ignore position ids, so packed examples attend to each other",
    "falcon": "Falcon's mask ignores position ids, so packed examples attend to each other",
}


def can_pack(config) -> str | None:
    """None if packed rows keep their examples apart for this model config, else a one-line reason."""
    model_type = getattr(config, "model_type", None)
    if model_type in CROSSES:
        return CROSSES[model_type]
    if model_type not in PACKABLE:
        return f"packing not verified for model type {model_type!r}: its examples might attend to each other"
    attn = getattr(config, "_attn_implementation", None)
    if attn is not None and attn.startswith("flash"):
        return f"{attn} separates packed examples only in one-row batches; use sdpa or eager"
    if attn not in (None, "sdpa", "eager", "flex_attention"):
        return f"attention {attn!r} does not read packed position ids"
    return None


def pack(lengths: list[int], block: int) -> list[list[int]]:
    """Best-fit decreasing: example indices grouped into blocks of at most `block` tokens.

    Every index appears exactly once; an example longer than `block` counts as `block` (the collate cuts it
    there, the only cut). Longest first, each into the open block with the least room that still fits it,
    ties to the oldest block: the same lengths always give the same blocks.
    """
    if block < 1:
        raise ValueError(f"block must be at least 1 token, got {block}")
    if any(n < 0 for n in lengths):
        raise ValueError("lengths must not be negative")
    order = sorted(range(len(lengths)), key=lambda i: (-min(lengths[i], block), i))
    blocks: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free tokens, block number), sorted: the best fit is the first with enough
    for i in order:
        need = min(lengths[i], block)
        at = bisect.bisect_left(room, (need, -1))
        if at == len(room):
            blocks.append([i])
            free, b = block - need, len(blocks) - 1
        else:
            free, b = room.pop(at)
            blocks[b].append(i)
            free -= need
        bisect.insort(room, (free, b))
    return blocks


@dataclass
class PackedCollator:
    """Collates blocks (each a list of examples) into a Batch: one row per block of exactly `block` tokens.

    inputs: input_ids and position_ids (restarting at 0 per example), no attention_mask (see the module doc).
    """

    pad_id: int
    block: int

    def __call__(self, blocks: list[list[Example]]) -> Batch:
        rows = len(blocks)
        input_ids = torch.full((rows, self.block), self.pad_id, dtype=torch.long)
        labels = torch.full((rows, self.block), IGNORE_INDEX, dtype=torch.long)
        position_ids = torch.zeros((rows, self.block), dtype=torch.long)
        real = n_samples = 0
        for r, examples in enumerate(blocks):
            at = 0
            for ids, target in examples:
                if len(ids) != len(target):
                    raise ValueError(f"labels ({len(target)}) must align with input_ids ({len(ids)})")
                n = min(len(ids), self.block)
                n_samples += 1
                if n == 0:
                    continue
                if at + n > self.block:
                    raise ValueError(f"examples of {at + n}+ tokens do not fit a block of {self.block}")
                input_ids[r, at : at + n] = torch.tensor(ids[:n], dtype=torch.long)
                labels[r, at : at + n] = torch.tensor(target[:n], dtype=torch.long)
                labels[r, at] = IGNORE_INDEX  # no loss across the boundary: see the module doc
                position_ids[r, at : at + n] = torch.arange(n)
                at += n
            real += at
            if at:  # pads continue the last example's positions
                last = int(position_ids[r, at - 1]) + 1
                position_ids[r, at:] = torch.arange(last, last + self.block - at)
        loss_items = int((labels[:, 1:] != IGNORE_INDEX).sum())  # what HF's shifted loss averages over
        inputs = {"input_ids": input_ids, "position_ids": position_ids}
        return Batch(inputs, labels, n_samples, real, rows * self.block, loss_items)


class PackedDataset(torch.utils.data.Dataset):
    """Examples grouped by `pack`: item i is block i's examples, for a DataLoader with `collate_fn=PackedCollator`."""

    def __init__(self, examples: list[Example], block: int):
        self.examples = examples
        self.blocks = pack([len(ids) for ids, _ in examples], block)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> list[Example]:
        return [self.examples[j] for j in self.blocks[i]]
