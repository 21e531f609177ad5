"""Tokenize rows for a task and collate them into batches that carry their own token counts.

Samples are tokenized once, truncated but unpadded; padding is the collator's job, so the plan's
`padding` ("max_length" like the seed studies, or "longest" in the batch) is one argument here.

causal-lm samples are token ids with their labels aligned to them (the model shifts them: position t
predicts label t+1): raw text is concatenated, an EOS after each document, and cut into blocks of
max_length (the last partial block kept), every token a label; a prompt/response row is the prompt's
tokens, the response's and EOS, labelled -100 on the prompt; a conversation is its chat template's
rendering, labelled on the assistant turns only (trainwise.training.data.chat).

With a `truncation` (TRL's SFTTrainer `truncation_mode`, issue 59: a study of the user's own SFTConfig), text and
prompt/response rows are prepared as `trl sft` prepares them instead: each document, or prompt + response, tokenized
as one string with the tokenizer's special tokens and the EOS token's text appended; the joined example cut to
max_length at its end (keep_start) or its start (keep_end), and an example left with no loss token dropped. Packed
rows (TRL's bfd) cut every example keep_start and drop none (`encode_lm(..., packed=True)`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainwise.core.batch import IGNORE_INDEX, Batch
from trainwise.training.data.chat import encode_chat

TRUNCATIONS = ("keep_start", "keep_end")  # TRL's SFTConfig.truncation_mode values


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


def trl_examples(rows, tokenizer, data_format: str) -> list[tuple[list[int], list[int]]]:
    """Text or prompt/response rows as TRL's SFTTrainer tokenizes them, uncut: (input ids, labels). A document is
    `text + eos_token` tokenized with the special tokens, every token a label; a pair is `prompt + response +
    eos_token` tokenized as one string, its labels -100 where its tokens agree with the prompt's own tokenization
    (TRL's completion mask: the completion starts where the two diverge)."""
    eos = tokenizer.eos_token or ""
    if not rows:  # (a tokenizer called on no text fails)
        return []
    if data_format == "text":
        docs = tokenizer([r["text"] + eos for r in rows])["input_ids"]
        return [(ids, list(ids)) for ids in docs]
    prompts = tokenizer([r["text"] for r in rows])["input_ids"]
    joined = tokenizer([r["text"] + r["target"] + eos for r in rows])["input_ids"]
    out = []
    for p, ids in zip(prompts, joined, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(p, ids, strict=False)) if a != b), min(len(p), len(ids)))
        out.append((ids, [IGNORE_INDEX] * n + ids[n:]))
    return out


def trl_cut(
    examples: list[tuple[list[int], list[int]]], max_length: int, truncation: str, packed: bool = False
) -> Encoded:
    """TRL's cut of its examples (see the module's docstring): unpacked, each cut by `truncation` and the examples left
    with no loss token dropped; packed (bfd), each cut keep_start and none dropped."""
    cut = slice(None, max_length) if packed or truncation == "keep_start" else slice(-max_length, None)
    kept = [(ids[cut], labels[cut]) for ids, labels in examples]
    if not packed:
        kept = [kept[i] for i in trl_kept(examples, max_length, truncation)]
    return Encoded([ids for ids, _ in kept], [labels for _, labels in kept])


def trl_kept(examples: list[tuple[list[int], list[int]]], max_length: int, truncation: str) -> list[int]:
    """The indices of the examples an unpacked TRL cut keeps: those with a loss token left once cut."""
    cut = slice(None, max_length) if truncation == "keep_start" else slice(-max_length, None)
    return [i for i, (_ids, labels) in enumerate(examples) if any(y != IGNORE_INDEX for y in labels[cut])]


def pair_notes(rows, tokenizer, max_length: int, which: str = "training", truncation: str = "") -> list[str]:
    """What cutting prompt/response pairs at --max-length did (as prompt_response cuts them, or TRL's `truncation`),
    a line (none when nothing was cut): how many pairs lost the prompt's beginning, and how many lost part of the
    response too; under TRL's cut, how many the unpacked rows drop."""
    if not rows:
        return []
    if truncation:
        examples = trl_examples(rows, tokenizer, "prompt_response")
        long = sum(len(ids) > max_length for ids, _ in examples)
        if not long:
            return []
        dropped = len(examples) - len(trl_cut(examples, max_length, truncation))
        how = "its end" if truncation == "keep_start" else "its beginning"
        gone = (
            f"; {dropped} of them keep no response token and are dropped from unpacked rows, as TRL drops them "
            "(packed rows keep them, cut at their end, without loss)"
            if dropped
            else ""
        )
        return [
            f"{long} of {len(rows)} {which} prompt/response pairs are longer than --max-length {max_length} tokens: "
            f"each loses {how}, as TRL's SFTTrainer cuts it (truncation_mode {truncation}){gone}"
        ]
    _pad, eos = lm_ids(tokenizer)
    prompts = tokenizer([r["text"] for r in rows], add_special_tokens=False)["input_ids"]
    responses = tokenizer([r["target"] for r in rows], add_special_tokens=False)["input_ids"]
    cut = lost = 0
    for p, r in zip(prompts, responses, strict=True):
        if len(p) + len(r) + 1 > max_length:
            cut += 1
            _ids, labels = prompt_response(p, [*r, eos], max_length)
            lost += sum(1 for y in labels if y != IGNORE_INDEX) < len(r) + 1
    if not cut:
        return []
    examples = trl_examples(rows, tokenizer, "prompt_response")  # as TRL tokenizes them: special tokens, joined
    masked = len(examples) - len(trl_cut(examples, max_length, "keep_start"))
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


def encode_lm(
    rows, tokenizer, data_format: str, max_length: int, truncation: str = "", packed: bool = False
) -> Encoded:
    """causal-lm samples (see the module's docstring); text has no special tokens but the EOS added here (a
    conversation has those its chat template writes). With a `truncation`, text and pairs as TRL prepares them for
    unpacked rows, or (`packed`) for its packed rows."""
    _pad, eos = lm_ids(tokenizer)
    if data_format == "chat":  # conversations left with no assistant token at max_length are left out
        chat = encode_chat(rows, tokenizer, max_length)
        return Encoded(chat.input_ids, chat.labels)
    if truncation:
        return trl_cut(trl_examples(rows, tokenizer, data_format), max_length, truncation, packed)
    prompts = tokenizer([r["text"] for r in rows], add_special_tokens=False)["input_ids"]
    if data_format == "text":
        blocks = text_blocks(prompts, eos, max_length)
        return Encoded(blocks, [list(b) for b in blocks])
    responses = tokenizer([r["target"] for r in rows], add_special_tokens=False)["input_ids"]
    pairs = [prompt_response(p, [*r, eos], max_length) for p, r in zip(prompts, responses, strict=True)]
    return Encoded([ids for ids, _ in pairs], [labels for _, labels in pairs])


def encode(
    rows,
    tokenizer,
    task: str,
    max_length: int,
    max_target_length: int,
    label2id=None,
    data_format: str = "",
    truncation: str = "",
) -> Encoded:
    if not rows:
        return Encoded([], [])
    if task == "causal-lm":
        return encode_lm(rows, tokenizer, data_format, max_length, truncation)
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
