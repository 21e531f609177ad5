"""Tokenize rows for a task and collate them into batches that carry their own token counts.

Samples are tokenized once, truncated but unpadded; padding is the collator's job, so the plan's
`padding` ("max_length" like the seed studies, or "longest" in the batch) is one argument here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass
class Encoded:
    input_ids: list[list[int]]
    labels: list[int] | list[list[int]]  # class ids, or target token ids for seq2seq

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]


def encode(rows, tokenizer, task: str, max_length: int, max_target_length: int, label2id=None) -> Encoded:
    if not rows:
        return Encoded([], [])
    texts = [r["text"] for r in rows]
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    if task == "classification":
        assert label2id is not None
        return Encoded(ids, [label2id[r["target"]] for r in rows])
    targets = tokenizer(text_target=[r["target"] for r in rows], truncation=True, max_length=max_target_length)
    return Encoded(ids, targets["input_ids"])


@dataclass
class Batch:
    """A collated batch plus the counts the measurements need."""

    inputs: dict[str, torch.Tensor]  # input_ids, attention_mask
    labels: torch.Tensor
    n_samples: int
    real_tokens: int  # non-pad tokens (inputs + targets)
    padded_tokens: int  # positions computed on, pads included (inputs + targets)
    loss_items: int  # what the loss averages over: samples, or non-ignored target tokens

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
        non_blocking = torch.device(device).type == "cuda"
        return Batch(
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.inputs.items()},
            self.labels.to(device, non_blocking=non_blocking),
            self.n_samples,
            self.real_tokens,
            self.padded_tokens,
            self.loss_items,
        )


def _pad(seqs: list[list[int]], width: int, value: int) -> torch.Tensor:
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


@dataclass
class Collator:
    task: str
    pad_id: int
    padding: str  # "max_length" | "longest"
    max_length: int
    max_target_length: int

    def __call__(self, items: list[tuple[list[int], object]]) -> Batch:
        ids = [x for x, _ in items]
        width = self.max_length if self.padding == "max_length" else max(len(x) for x in ids)
        input_ids = _pad(ids, width, self.pad_id)
        mask = (torch.arange(width)[None, :] < torch.tensor([len(x) for x in ids])[:, None]).long()
        real, padded = sum(len(x) for x in ids), len(ids) * width
        if self.task == "classification":
            labels = torch.tensor([y for _, y in items], dtype=torch.long)
            loss_items = len(items)
        else:
            targets: list[list[int]] = [y for _, y in items]  # type: ignore[misc]
            t_width = self.max_target_length if self.padding == "max_length" else max(len(t) for t in targets)
            labels = _pad(targets, t_width, IGNORE_INDEX)
            real += sum(len(t) for t in targets)
            padded += len(targets) * t_width
            loss_items = int((labels != IGNORE_INDEX).sum())
        return Batch({"input_ids": input_ids, "attention_mask": mask}, labels, len(items), real, padded, loss_items)


class EncodedDataset(torch.utils.data.Dataset):
    def __init__(self, enc: Encoded):
        self.enc = enc

    def __len__(self) -> int:
        return len(self.enc)

    def __getitem__(self, i: int):
        return self.enc.input_ids[i], self.enc.labels[i]
