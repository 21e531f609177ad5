"""A study's prepared data (written by `trainwise.study.prepare` through `study.store`), loaded for a run: the
training set, how to batch it, and how to score a model on the held-out rows."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainwise.core.config import METRICS
from trainwise.run.ranks import unwrap
from trainwise.spec.config import TrialSpec
from trainwise.strategies.lm.packing import PackedCollator, PackedDataset
from trainwise.training.data.chat import last_turn
from trainwise.training.data.metrics import accuracy, text_metrics
from trainwise.training.data.tasks import (
    IGNORE_INDEX,
    Batch,
    Collator,
    Encoded,
    EncodedDataset,
    encode,
    lm_ids,
    shifted_loss_sum,
    trl_cut,
    trl_examples,
    trl_kept,
)
from trainwise.training.models import ModelSource, load_tokenizer
from trainwise.training.vision import IMAGE_TASK, ImageDataset, Images, collate_images, read_images


def read_labels(data_dir: str) -> list[str]:
    """The class names of a study's prepared data, in id order."""
    return json.loads((Path(data_dir) / "labels.json").read_text(encoding="utf-8"))


def read_prepared(data_dir: str) -> tuple[list[dict], list[dict], list[str]]:
    root = Path(data_dir)
    rows = [
        [json.loads(x) for x in (root / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        for split in ("train", "eval")
    ]
    return rows[0], rows[1], read_labels(data_dir)


@dataclass
class TrialData:
    """What the loop needs from a task's data: the training set, how to batch it, how to score."""

    train: torch.utils.data.Dataset
    lengths: list[int]  # per training sample (what length-aware samplers sort by)
    collate: Callable[[str], Callable[[list], Batch]]  # padding ("max_length" | "longest") -> collate function
    n_eval: int
    evaluate: Callable[[Any, Any], dict[str, float]]  # (model, accelerator) -> metrics
    metric: str  # the task's headline metric, a key of what `evaluate` returns (higher is better)
    channels: int = 0  # images: input channels
    # writes a model users load without trainwise: (model, directory, its weights when gathered from ZeRO-3)
    save: Callable[[Any, Path, dict | None], None] | None = None
    # causal LM: the training set packed into --max-length rows -> (dataset, row lengths, collate function)
    packed: Callable[[], tuple[torch.utils.data.Dataset, list[int], Callable[[list], Batch]]] | None = None
    # causal LM: the share of the training set's tokens that carry loss, counted over every example as encoded
    # (HF's shifted loss: an example's first token is never scored), not over the batches a trial draws
    loss_token_share: float | None = None
    # the training examples an unpacked epoch holds, where they are not the study's n_train: TRL's cut drops those
    # left with no loss token from unpacked rows, and packed rows keep them (issue 59)
    examples: int | None = None


def save_text_model(model, path: Path, tokenizer, labels: list[str], task: str, state_dict: dict | None) -> None:
    """A Hugging Face model directory: config (with the data's label names), weights, tokenizer, so that
    `from_pretrained` and `pipeline(...)` load it with no trainwise code."""
    from transformers.utils import logging as hf_logging  # heavy: transformers

    hf_logging.disable_progress_bar()  # the shard-writing bar, at every evaluation that improves
    if task == "classification":
        model.config.id2label = dict(enumerate(labels))
        model.config.label2id = {label: i for i, label in enumerate(labels)}
    if task == "causal-lm":  # generation reads the cache and the pad id; training ran without a cache
        pad, _eos = lm_ids(tokenizer)
        model.config.use_cache = model.generation_config.use_cache = True
        model.generation_config.pad_token_id = pad
        try:
            model.save_pretrained(path, state_dict=state_dict)
        finally:
            model.config.use_cache = model.generation_config.use_cache = False
    else:
        model.save_pretrained(path, state_dict=state_dict)
    tokenizer.save_pretrained(path)


def load_data(spec: TrialSpec) -> TrialData:
    return _image_data(spec) if spec.settings.task == IMAGE_TASK else _text_data(spec)


# the tasks' headline metrics, higher is better: a causal LM's is minus its evaluation loss (mean cross-entropy
# per loss token, in nats), so the quality phase and advise rank it as they rank accuracy; perplexity beside it


def _text_data(spec: TrialSpec) -> TrialData:
    s = spec.settings
    tokenizer = load_tokenizer(ModelSource(s.model_kind, s.model_ref), s.tokenizer_dir)
    train_rows, eval_rows, labels = read_prepared(s.data_dir)
    label2id = {label: i for i, label in enumerate(labels)}
    lengths = (s.max_length, s.max_target_length)
    trl = s.truncation if s.task == "causal-lm" and s.data_format != "chat" else ""
    if trl:  # TRL's cut (issue 59): unpacked rows drop what packed rows keep, so each is cut from the same examples
        examples = trl_examples(train_rows, tokenizer, s.data_format)
        train = trl_cut(examples, s.max_length, trl)
        whole = trl_cut(examples, s.max_length, trl, packed=True)
    else:
        train = whole = encode(train_rows, tokenizer, s.task, *lengths, label2id, s.data_format)
    eval_rows = eval_rows[: s.eval_samples]
    if trl:  # the held-out examples tokenized once: the references are those of the pairs the cut kept
        held = trl_examples(eval_rows, tokenizer, s.data_format)
        evals = trl_cut(held, s.max_length, trl)
        if s.data_format == "prompt_response":
            eval_rows = [eval_rows[i] for i in trl_kept(held, s.max_length, trl)]
    else:
        evals = encode(eval_rows, tokenizer, s.task, *lengths, label2id, s.data_format)
    gold = [r["target"] for r in eval_rows] if s.data_format != "chat" else chat_references(evals, tokenizer)
    pad = lm_ids(tokenizer)[0] if s.task == "causal-lm" else tokenizer.pad_token_id
    evaluate = evaluate_lm if s.task == "causal-lm" else evaluate_text
    return TrialData(
        EncodedDataset(train),
        train.lengths(),
        lambda padding: Collator(s.task, pad, padding, s.max_length, s.max_target_length),
        len(evals),
        lambda model, acc: evaluate(model, acc, evals, gold, spec, tokenizer, labels),
        METRICS[s.task],
        save=lambda model, path, weights: save_text_model(model, path, tokenizer, labels, s.task, weights),
        packed=(lambda: packed_rows(whole, pad, s.max_length)) if s.task == "causal-lm" else None,
        loss_token_share=loss_token_share(train) if s.task == "causal-lm" else None,
        examples=len(train) if trl else None,
    )


def loss_token_share(enc: Encoded) -> float:
    """The share of a causal LM's encoded tokens that carry loss: labels after each example's first position
    that are not -100 (what HF's shifted loss averages over), over all tokens. Packing does not change it: a
    packed row drops exactly each example's first label, which the shift never scores either."""
    rows: list[list[int]] = enc.labels  # type: ignore[assignment]  # a causal LM's labels are token lists
    # list.count runs in C: a per-token Python loop cost seconds per trial on a large training set
    scored = sum(len(labels) - 1 - labels[1:].count(IGNORE_INDEX) for labels in rows if labels)
    tokens = sum(enc.lengths())
    return scored / tokens if tokens else 0.0


def chat_references(enc: Encoded, tokenizer) -> list[str]:
    """Each held-out conversation's reference answer: its last assistant turn as encoded (cut where the
    conversation was cut), as text."""
    return [
        tokenizer.decode(last_turn(ids, labels)[1], skip_special_tokens=True).strip()  # type: ignore[arg-type]
        for ids, labels in zip(enc.input_ids, enc.labels, strict=True)
    ]


def packed_rows(enc: Encoded, pad: int, block: int) -> tuple[PackedDataset, list[int], PackedCollator]:
    """A causal LM's training examples packed into rows of `block` tokens (trainwise.strategies.lm.packing)."""
    rows = PackedDataset(list(zip(enc.input_ids, enc.labels, strict=True)), block)  # type: ignore[arg-type]
    return rows, [block] * len(rows), PackedCollator(pad, block)


def _image_data(spec: TrialSpec) -> TrialData:
    s = spec.settings
    train, evals = read_images(Path(s.data_dir) / "images.npz")
    train_ds = ImageDataset(train, train=True, seed=s.seed)
    eval_ds = ImageDataset(Images(evals.x[: s.eval_samples], evals.y[: s.eval_samples]), train=False, seed=s.seed)
    eval_ds.mean, eval_ds.std = train_ds.mean, train_ds.std  # normalised with the training statistics
    return TrialData(
        train_ds,
        [1] * len(train),
        lambda _padding: collate_images,
        len(eval_ds),
        lambda model, acc: evaluate_images(model, acc, eval_ds, s.batch_size),
        "accuracy",
        channels=train.x.shape[-1],
    )


@torch.no_grad()
def evaluate_text(model, accelerator, enc: Encoded, gold: list[str], spec: TrialSpec, tokenizer, labels) -> dict:
    """The task's metric on the held-out rows, and their loss (`eval_loss`: the mean cross-entropy per
    item, with teacher forcing for seq2seq), what early stopping on the evaluation loss watches."""
    s = spec.settings
    model.eval()
    collate = Collator(s.task, tokenizer.pad_token_id, "longest", s.max_length, s.max_target_length)
    ds = EncodedDataset(enc)
    preds: list = []
    loss_sum, items = 0.0, 0
    for start in range(0, len(ds), s.batch_size):
        batch = collate([ds[i] for i in range(start, min(start + s.batch_size, len(ds)))]).to(accelerator.device)
        with accelerator.autocast():
            if s.task == "classification":
                logits = model(**batch.inputs).logits
                preds += logits.argmax(-1).tolist()
                loss_sum += float(F.cross_entropy(logits.float(), batch.labels, reduction="sum"))
            else:
                raw = unwrap(model)
                decoder_ids = raw.prepare_decoder_input_ids_from_labels(labels=batch.labels)
                logits = model(**batch.inputs, decoder_input_ids=decoder_ids).logits
                loss_sum += float(
                    F.cross_entropy(
                        logits.float().reshape(-1, logits.shape[-1]),
                        batch.labels.reshape(-1),
                        ignore_index=IGNORE_INDEX,
                        reduction="sum",
                    )
                )
                out = raw.generate(
                    **batch.inputs,
                    max_new_tokens=s.max_target_length,
                    num_beams=s.num_beams,
                    length_penalty=s.length_penalty,
                    do_sample=False,
                )
                preds += tokenizer.batch_decode(out, skip_special_tokens=True)
        items += batch.loss_items
    model.train()
    eval_loss = {"eval_loss": loss_sum / items} if items else {}
    if s.task == "classification":  # majority_accuracy: what always answering the commonest class scores here
        ids = [labels.index(g) for g in gold]
        return {"accuracy": 100 * accuracy(preds, ids), **chance(ids), **eval_loss}
    return {**text_metrics([p.strip() for p in preds], gold), **eval_loss}


@torch.no_grad()
def evaluate_lm(model, accelerator, enc: Encoded, gold, spec: TrialSpec, tokenizer, _labels) -> dict[str, float]:
    """A causal LM on the held-out rows: the mean cross-entropy per loss token (`eval_loss`), its perplexity,
    and `neg_eval_loss`, the task's metric (higher is better)."""
    s = spec.settings
    model.eval()
    collate = Collator(s.task, lm_ids(tokenizer)[0], "longest", s.max_length, s.max_target_length)
    ds = EncodedDataset(enc)
    loss_sum, items = 0.0, 0
    for start in range(0, len(ds), s.batch_size):
        batch = collate([ds[i] for i in range(start, min(start + s.batch_size, len(ds)))]).to(accelerator.device)
        with accelerator.autocast():
            loss_sum += float(shifted_loss_sum(model(**batch.inputs).logits, batch.labels))
        items += batch.loss_items
    generated = _generate_responses(model, accelerator, enc, gold, spec, tokenizer) if s.data_format != "text" else {}
    model.train()
    if not items:
        return {}
    loss = loss_sum / items
    return {"neg_eval_loss": -loss, "eval_loss": loss, "perplexity": math.exp(min(loss, 700.0)), **generated}


@torch.no_grad()
def _generate_responses(model, accelerator, enc: Encoded, gold: list[str], spec: TrialSpec, tokenizer) -> dict:
    """Prompt/response and chat data: each held-out prompt (the tokens before the last labelled run: the prompt,
    or the conversation up to its last assistant turn with the generation prompt) answered by greedy decoding
    of at most --max-target-length tokens, scored against the reference (the response, or the last assistant
    turn: ROUGE-L, BLEU by text_metrics). Generation stops at EOS or at a token that ends a labelled run (a
    chat template's end-of-turn token) when it is a special token."""
    s = spec.settings
    pad, eos = lm_ids(tokenizer)
    raw = unwrap(model)
    labelled: list[tuple[list[int], list[int]]] = list(zip(enc.input_ids, enc.labels, strict=True))  # type: ignore[arg-type]
    turns = [last_turn(ids, labels) for ids, labels in labelled]
    prompts = [prompt for prompt, _ in turns]
    special = set(tokenizer.all_special_ids)
    stops = sorted({eos} | {answer[-1] for _, answer in turns if answer and answer[-1] in special})
    preds: list[str] = []
    for start in range(0, len(prompts), s.batch_size):
        chunk = [p or [eos] for p in prompts[start : start + s.batch_size]]
        width = max(map(len, chunk))  # left-padded: every prompt ends where generation starts
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=accelerator.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=accelerator.device)
        with accelerator.autocast():
            out = raw.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=s.max_target_length,
                do_sample=False,
                use_cache=True,
                pad_token_id=pad,
                eos_token_id=stops,
            )
        preds += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    scores = text_metrics([p.strip() for p in preds], gold[: len(preds)])
    return {"rougeL": scores["rougeL"], "bleu": scores["bleu"]}


@torch.no_grad()
def evaluate_images(model, accelerator, ds, batch_size: int) -> dict[str, float]:
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(ds), batch_size):
        batch = collate_images([ds[i] for i in range(start, min(start + batch_size, len(ds)))]).to(accelerator.device)
        with accelerator.autocast():
            logits = model(**batch.inputs).logits
            correct += int((logits.argmax(-1) == batch.labels).sum())
            loss_sum += float(F.cross_entropy(logits.float(), batch.labels, reduction="sum"))
    model.train()
    gold = [int(y) for y in ds.images.y]  # (an ImageDataset: its labels, without decoding the images)
    return {"accuracy": 100 * correct / len(ds), "eval_loss": loss_sum / len(ds), **chance(gold)}


def chance(gold: list) -> dict[str, float]:
    """What a model that learned nothing of the inputs scores on these held-out labels: always answering the
    commonest class (`majority_accuracy`, %), and predicting each class at its frequency (`prior_loss`: the labels'
    entropy, the cross-entropy of the class frequencies; a fresh head predicting uniformly scores ln K above it)."""
    if not gold:
        return {}
    counts = Counter(gold).values()
    n = len(gold)
    return {
        "majority_accuracy": 100 * max(counts) / n,
        "prior_loss": -sum(c / n * math.log(c / n) for c in counts),
    }
