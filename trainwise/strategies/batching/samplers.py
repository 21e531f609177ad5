"""Batch samplers. "random" is the baseline; "length_grouped" is smart batching.

Both yield the same number of batches per epoch from the same seeded permutation, so they differ
only in how samples are grouped.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class RandomBatches:
    """Shuffle, then cut into fixed-size batches (last partial batch dropped)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        self.n, self.batch_size, self.seed, self.epoch = len(lengths), batch_size, seed, 0

    def _perm(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        perm = self._perm()
        for i in range(len(self)):
            yield perm[i * self.batch_size : (i + 1) * self.batch_size]


class LengthGroupedBatches(RandomBatches):
    """Smart batching: shuffled mega-batches of `mega` batches, each sorted by length, cut into
    batches, and the batches shuffled again so lengths do not trend through the epoch."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, mega: int = 50):
        super().__init__(lengths, batch_size, seed)
        self.lengths, self.mega = lengths, mega

    def __iter__(self) -> Iterator[list[int]]:
        perm = self._perm()[: len(self) * self.batch_size]
        span = self.mega * self.batch_size
        batches = []
        for start in range(0, len(perm), span):
            chunk = sorted(perm[start : start + span], key=lambda i: -self.lengths[i])
            batches += [chunk[j : j + self.batch_size] for j in range(0, len(chunk), self.batch_size)]
        g = torch.Generator().manual_seed(self.seed + self.epoch + 10_007)
        for k in torch.randperm(len(batches), generator=g).tolist():
            yield batches[k]


class SortishBatches(LengthGroupedBatches):
    """fastai's SortishSampler (used by the old HF Seq2SeqTrainer): chunks of 50 batches of the shuffled
    data, each sorted by length, cut into batches; the batch holding the longest sample goes first (so
    an out-of-memory happens at step 1, not hours in), the others in random order."""

    def __iter__(self) -> Iterator[list[int]]:
        batches = list(super().__iter__())  # sorted chunks, batches shuffled
        if not batches:
            return
        longest = max(range(len(batches)), key=lambda k: max(self.lengths[i] for i in batches[k]))
        yield batches[longest]
        yield from (b for k, b in enumerate(batches) if k != longest)


def make_batches(kind: str, lengths: list[int], batch_size: int, seed: int) -> RandomBatches:
    samplers = {"random": RandomBatches, "length_grouped": LengthGroupedBatches, "sortish": SortishBatches}
    return samplers[kind](lengths, batch_size, seed)


class RankShard:
    """Data parallelism: every rank draws the same global batches and keeps every `world`-th sample
    of each, so the ranks together see exactly the single-process batches (DDP 2 x bs4 == 1 x bs8)."""

    def __init__(self, inner: RandomBatches, rank: int, world: int):
        assert inner.batch_size % world == 0, "validated at the edge: micro-batch divisible by --nproc"
        self.inner, self.rank, self.world = inner, rank, world

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.inner:
            yield batch[self.rank :: self.world]
