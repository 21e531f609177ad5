"""Tokenize rows for a task and collate them into batches that carry their own token counts.

Samples are tokenized once, truncated but unpadded; padding is the collator's job, so the plan's
`padding` ("max_length" like the seed studies, or "longest" in the batch) is one argument here.

causal-lm samples are token ids with their labels aligned to them (the model shifts them: position t
predicts label t+1): raw text is concatenated, an EOS after each document, and cut into blocks of
max_length (the last partial block kept), every token a label; a prompt/response row is the prompt's
tokens, the response's and EOS, labelled -100 on the prompt; a conversation is its chat template's
rendering, labelled on the assistant turns only (trainwise.training.data.chat).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainwise.training.data.chat import IGNORE_INDEX, encode_chat


@dataclass
class Encoded:
    input_ids: list[list[int]]
    labels: list[int] | list[list[int]]  # class ids, or target token ids for seq2seq

    def __len__(self) -> int:
        return len(self.input_ids)

    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]


def lm_ids(tokenizer) -> tuple[int, int]:
    """(pad id, eos id) of a causal LM's tokenizer: without a pad token (GPT-2's), EOS pads; padding is never
    a label, so which id it is does not matter to the loss."""
    eos = tokenizer.eos_token_id
    assert eos is not None, "prepare_study refuses a causal-lm tokenizer without an EOS token"
    return (tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos), eos


def text_blocks(docs: list[list[int]], eos: int, max_length: int) -> list[list[int]]:
    """Documents' token ids concatenated, each followed by EOS, cut into blocks of max_length: no token is
    lost (the last block may be shorter)."""
    stream = [t for doc in docs for t in (*doc, eos)]
    return [stream[i : i + max_length] for i in range(0, len(stream), max_length)]


def prompt_response(prompt: list[int], response: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """(input ids, labels) of one prompt/response pair: prompt + response (EOS included), at most max_length
    tokens. A long pair loses the prompt's beginning first; a response longer than the room keeps half the
    room for the prompt's end (so the response is predicted from some prompt) and loses its own end."""
    keep = min(len(prompt), max(max_length - len(response), max_length // 2))
    kept = prompt[len(prompt) - keep :] if keep > 0 else []
    answer = response[: max_length - len(kept)]
    return kept + answer, [IGNORE_INDEX] * len(kept) + answer


def pair_notes(rows, tokenizer, max_length: int, which: str = "training") -> list[str]:
    """What cutting prompt/response pairs at --max-length did (as prompt_response cuts them), a line (none when
    nothing was cut): how many pairs lost the prompt's beginning, and how many lost part of the response too."""
    if not rows:
        return []
    _pad, eos = lm_ids(tokenizer)
    prompts = tokenizer([r["text"] for r in rows], add_special_tokens=False)["input_ids"]
    responses = tokenizer([r["target"] for r in rows], add_special_tokens=False)["input_ids"]
    cut = lost = masked = 0
    for p, r in zip(prompts, responses, strict=True):
        if len(p) + len(r) + 1 > max_length:
            cut += 1
            _ids, labels = prompt_response(p, [*r, eos], max_length)
            lost += sum(1 for y in labels if y != IGNORE_INDEX) < len(r) + 1
            masked += len(p) >= max_length
    if not cut:
        return []
    part = f"; {lost} of them lose the end of their response too" if lost else ""
    # TRL's SFTTrainer cuts the joined pair's end (truncation_mode keep_start) and, unpacked, drops a pair left with
    # no response token: `trl sft` on this data trains fewer pairs than these trials (issue 59, BENCHMARKS §U1)
    trl = (
        f"; TRL's SFTTrainer (truncation_mode keep_start, unpacked) keeps {masked} of them as their prompt alone and "
        "drops them"
        if masked
        else ""
    )
    return [
        f"{cut} of {len(rows)} {which} prompt/response pairs are longer than --max-length {max_length} tokens: "
        f"each loses its prompt's beginning first{part}{trl}"
    ]


def encode_lm(rows, tokenizer, data_format: str, max_length: int) -> Encoded:
    """causal-lm samples (see the module's docstring); text has no special tokens but the EOS added here (a
    conversation has those its chat template writes)."""
    _pad, eos = lm_ids(tokenizer)
    if data_format == "chat":  # conversations left with no assistant token at max_length are left out
        chat = encode_chat(rows, tokenizer, max_length)
        return Encoded(chat.input_ids, chat.labels)
    prompts = tokenizer([r["text"] for r in rows], add_special_tokens=False)["input_ids"]
    if data_format == "text":
        blocks = text_blocks(prompts, eos, max_length)
        return Encoded(blocks, [list(b) for b in blocks])
    responses = tokenizer([r["target"] for r in rows], add_special_tokens=False)["input_ids"]
    pairs = [prompt_response(p, [*r, eos], max_length) for p, r in zip(prompts, responses, strict=True)]
    return Encoded([ids for ids, _ in pairs], [labels for _, labels in pairs])


def encode(
    rows, tokenizer, task: str, max_length: int, max_target_length: int, label2id=None, data_format: str = ""
) -> Encoded:
    if not rows:
        return Encoded([], [])
    if task == "causal-lm":
        return encode_lm(rows, tokenizer, data_format, max_length)
    texts = [r["text"] for r in rows]
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    if task == "classification":
        assert label2id is not None
        return Encoded(ids, [label2id[r["target"]] for r in rows])
    targets = tokenizer(text_target=[r["target"] for r in rows], truncation=True, max_length=max_target_length)
    return Encoded(ids, targets["input_ids"])


def shifted_loss_sum(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """A causal LM's summed cross-entropy in fp32, as transformers' ForCausalLMLoss computes it before its
    mean: position t predicts label t+1, -100 labels (prompt, padding) ignored."""
    return F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
        label_smoothing=label_smoothing,
    )


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
    padding: str  # "max_length" | "longest" | "none" (causal LM: one row per batch)
    max_length: int
    max_target_length: int

    def __call__(self, items: list[tuple[list[int], object]]) -> Batch:
        ids = [x for x, _ in items]
        if self.padding == "none":  # padding_free (causal LM): the batch is one row of its examples
            return _flattened(items, self.pad_id)  # type: ignore[arg-type]
        width = self.max_length if self.padding == "max_length" else max(len(x) for x in ids)
        input_ids = _pad(ids, width, self.pad_id)
        mask = (torch.arange(width)[None, :] < torch.tensor([len(x) for x in ids])[:, None]).long()
        real, padded = sum(len(x) for x in ids), len(ids) * width
        if self.task == "causal-lm":  # labels aligned with the inputs; the model shifts them
            labels = _pad([y for _, y in items], width, IGNORE_INDEX)  # type: ignore[misc]
            loss_items = int((labels[:, 1:] != IGNORE_INDEX).sum())
        elif self.task == "classification":
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


def _flattened(items: list[tuple[list[int], list[int]]], pad_id: int) -> Batch:
    """A causal LM's batch with no padding: its examples one after another in ONE row, position ids restarting at 0
    for each, no attention mask (transformers keeps the examples apart from the position ids, as for packed rows:
    trainwise.strategies.lm.packing), and the label at each example's first position -100 (no loss across a
    boundary)."""
    row = [t for x, _ in items for t in x] or [pad_id]
    labels, positions = [], []
    for x, y in items:
        labels += [IGNORE_INDEX, *y[1:]] if x else []
        positions += list(range(len(x)))
    labels = labels or [IGNORE_INDEX]
    positions = positions or [0]
    input_ids = torch.tensor([row], dtype=torch.long)
    target = torch.tensor([labels], dtype=torch.long)
    inputs = {"input_ids": input_ids, "position_ids": torch.tensor([positions], dtype=torch.long)}
    real = sum(len(x) for x, _ in items)
    return Batch(inputs, target, len(items), real, real, int((target[:, 1:] != IGNORE_INDEX).sum()))


class EncodedDataset(torch.utils.data.Dataset):
    def __init__(self, enc: Encoded):
        self.enc = enc

    def __len__(self) -> int:
        return len(self.enc)

    def __getitem__(self, i: int):
        return self.enc.input_ids[i], self.enc.labels[i]
