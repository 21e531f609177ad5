"""Packing: no example lost, blocks respected, and inside a packed row each example computes what it computes alone."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import transformers

from trainwise.strategies.lm.packing import CROSSES, PACKABLE, PackedCollator, PackedDataset, can_pack, pack
from trainwise.training.data.tasks import IGNORE_INDEX

VOCAB, PAD = 1000, 0
_ATTN = dict(num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB, max_position_embeddings=128)
_GQA = dict(_ATTN, hidden_size=64, intermediate_size=128, num_key_value_heads=2)

# one tiny random-init config per family that can_pack knows about (a registry: adding a family adds its check)
TINY = {
    "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=VOCAB),
    "llama": lambda: transformers.LlamaConfig(**_GQA),
    "qwen2": lambda: transformers.Qwen2Config(**_GQA),
    "qwen3": lambda: transformers.Qwen3Config(**_GQA, head_dim=16),
    "mistral": lambda: transformers.MistralConfig(**_GQA),
    "gemma": lambda: transformers.GemmaConfig(**_GQA, head_dim=16),
    "phi3": lambda: transformers.Phi3Config(**_GQA, pad_token_id=PAD),
    "phi": lambda: transformers.PhiConfig(**_ATTN, hidden_size=64, intermediate_size=128),
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**_ATTN, hidden_size=64, intermediate_size=128),
    "gpt_bigcode": lambda: transformers.GPTBigCodeConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB),
    "gptj": lambda: transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=VOCAB),
    "opt": lambda: transformers.OPTConfig(**_ATTN, hidden_size=64, ffn_dim=128, word_embed_proj_dim=64),
    "bloom": lambda: transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB),
    "falcon": lambda: transformers.FalconConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB
    ),
}
NO_SDPA = {"gptj", "bloom"}  # transformers refuses sdpa for these: eager is what they run

_models: dict[tuple[str, str], torch.nn.Module] = {}


def tiny(family: str, attn: str = "sdpa") -> torch.nn.Module:
    if (family, attn) not in _models:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(TINY[family](), attn_implementation=attn)
        _models[family, attn] = model.eval().float()
    return _models[family, attn]


def examples(seed: int = 0, lengths=(7, 5, 3, 9, 2, 4)) -> list[tuple[list[int], list[int]]]:
    """Random token examples; the first 2 tokens of each are a 'prompt' with no loss."""
    rng = random.Random(seed)
    out = []
    for n in lengths:
        ids = [rng.randrange(1, VOCAB) for _ in range(n)]
        out.append((ids, [IGNORE_INDEX] * min(n, 2) + ids[2:]))
    return out


def packed_batch(exs, block: int = 16):
    dataset = PackedDataset(exs, block)
    return dataset, PackedCollator(PAD, block)([dataset[i] for i in range(len(dataset))])


def spans(batch):
    """(row, start, length) of each example in collate order, read back from the position ids."""
    out = []
    for r, row in enumerate(batch.inputs["position_ids"].tolist()):
        starts = [t for t, p in enumerate(row) if p == 0]
        real = int((batch.inputs["input_ids"][r] != PAD).sum())
        for a, b in zip(starts, [*starts[1:], real], strict=True):
            out.append((r, a, b - a))
    return out


@torch.no_grad()
def max_gap_alone_vs_packed(model, exs, block: int = 16, **forward) -> float:
    """Largest |logit difference| between each example run alone and the same example inside a packed row."""
    dataset, batch = packed_batch(exs, block)
    forward.setdefault("use_cache", False)
    packed = model(**batch.inputs, **forward).logits
    order = [exs[j] for b in dataset.blocks for j in b]
    gap = 0.0
    for (r, a, n), (ids, _) in zip(spans(batch), order, strict=True):
        alone = model(torch.tensor([ids[:n]]), use_cache=False).logits[0]
        gap = max(gap, float((packed[r, a : a + n] - alone).abs().max()))
    return gap


# ---- pack --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_pack_keeps_every_example_once_and_respects_the_block(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([1, 3, 17, 40, 64, 100]) for _ in range(200)]
    blocks = pack(lengths, 64)
    assert sorted(i for b in blocks for i in b) == list(range(200))
    assert all(sum(min(lengths[i], 64) for i in b) <= 64 for b in blocks)
    # no token lost but the cut of the 100-token examples, the only cut
    assert sum(min(n, 64) for n in lengths) == sum(lengths) - 36 * lengths.count(100)
    assert pack(lengths, 64) == blocks  # deterministic
    assert pack(list(lengths), 64) == blocks


def test_pack_is_best_fit_decreasing():
    # longest first; 3 goes to block 0 (room 3, an exact fit) rather than block 1 (room 4); the 1 fills block 1
    assert pack([5, 4, 3, 3, 1], 8) == [[0, 2], [1, 3, 4]]
    assert pack([], 8) == []
    assert pack([9, 9], 8) == [[0], [1]]  # too long: one block each, cut at the collate


def test_pack_refuses_a_block_below_one_token():
    with pytest.raises(ValueError, match="block"):
        pack([1, 2], 0)


# ---- collate -----------------------------------------------------------------------------------------------


def test_collate_restarts_positions_and_adds_no_mask():
    a = ([11, 12, 13], [-100, 12, 13])
    b = ([21, 22], [21, 22])
    c = ([31, 32, 33, 34, 35, 36, 37], [31, 32, 33, 34, 35, 36, 37])  # longer than the block: cut to 6
    batch = PackedCollator(pad_id=PAD, block=6)([[a, b], [c]])
    assert set(batch.inputs) == {"input_ids", "position_ids"}
    assert batch.inputs["input_ids"].tolist() == [[11, 12, 13, 21, 22, PAD], [31, 32, 33, 34, 35, 36]]
    assert batch.inputs["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]]
    # each example's first label is -100: its score would come from the previous example's last logits
    assert batch.labels.tolist() == [[-100, 12, 13, -100, 22, -100], [-100, 32, 33, 34, 35, 36]]
    assert (batch.n_samples, batch.real_tokens, batch.padded_tokens) == (3, 11, 12)
    assert batch.loss_items == 8 == int((batch.labels[:, 1:] != IGNORE_INDEX).sum())


def test_collate_refuses_overfull_blocks_and_misaligned_labels():
    with pytest.raises(ValueError, match="do not fit"):
        PackedCollator(PAD, 4)([[([1, 2, 3], [1, 2, 3]), ([4, 5], [4, 5])]])
    with pytest.raises(ValueError, match="align"):
        PackedCollator(PAD, 4)([[([1, 2, 3], [1, 2])]])


def test_packed_dataset_feeds_a_dataloader():
    exs = examples(lengths=(7, 5, 3, 9, 2, 4, 16, 1))
    loader = torch.utils.data.DataLoader(PackedDataset(exs, 16), batch_size=2, collate_fn=PackedCollator(PAD, 16))
    batches = list(loader)
    assert sum(b.n_samples for b in batches) == len(exs)
    assert sum(b.real_tokens for b in batches) == sum(len(ids) for ids, _ in exs)
    assert all(b.inputs["input_ids"].shape[1] == 16 for b in batches)


# ---- the model sees each example alone -------------------------------------------------------------------


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_a_packed_example_computes_what_it_computes_alone(family, attn):
    assert can_pack(tiny(family, attn).config) is None
    assert max_gap_alone_vs_packed(tiny(family, attn), examples()) < 1e-5


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_a_mask_or_cache_lets_packed_examples_see_each_other(family):
    """The failure mode is visible: were the collate to add a mask, or the forward a cache, this would catch it."""
    model, exs = tiny(family), examples()
    _, batch = packed_batch(exs)
    ones = torch.ones_like(batch.inputs["input_ids"])
    assert max_gap_alone_vs_packed(model, exs, attention_mask=ones) > 1e-2
    assert max_gap_alone_vs_packed(model, exs, use_cache=True) > 1e-2


@pytest.mark.parametrize("family", sorted(PACKABLE | set(CROSSES)))
def test_can_pack_says_what_each_family_does(family):
    model = tiny(family, "eager" if family in NO_SDPA else "sdpa")
    gap = max_gap_alone_vs_packed(model, examples(seed=1))
    if can_pack(model.config) is None:
        assert gap < 1e-5
    else:
        assert family in CROSSES and gap > 1e-3


def test_can_pack_reasons():
    assert "not verified" in can_pack(SimpleNamespace(model_type="mamba"))
    assert "attend to each other" in can_pack(SimpleNamespace(model_type="opt"))
    flash = SimpleNamespace(model_type="llama", _attn_implementation="flash_attention_2")
    assert "one-row" in can_pack(flash)
    assert can_pack(SimpleNamespace(model_type="llama", _attn_implementation="sdpa")) is None


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_packed_loss_is_the_token_weighted_mean_of_each_alone(family):
    model, exs = tiny(family), examples(seed=2)
    _, batch = packed_batch(exs)
    with torch.no_grad():
        packed = model(**batch.inputs, labels=batch.labels, use_cache=False).loss
        sums, items = 0.0, 0
        for ids, labels in exs:
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, :-1]
            target = torch.tensor(labels[1:])
            sums += float(F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum"))
            items += int((target != IGNORE_INDEX).sum())
    assert items == batch.loss_items
    assert float(packed) == pytest.approx(sums / items, abs=1e-5)


def test_the_config_cache_crosses_examples_until_turned_off():
    """transformers builds a cache in train mode too when config.use_cache is True (the default): packing then
    crosses examples silently. A packing strategy must set model.config.use_cache = False."""
    model = tiny("llama")
    _, batch = packed_batch(examples())
    with torch.no_grad():
        separate = model(**batch.inputs, use_cache=False).logits
        model.train()
        try:
            assert model.config.use_cache
            assert not torch.allclose(model(**batch.inputs).logits, separate, atol=1e-3)
            model.config.use_cache = False
            assert torch.allclose(model(**batch.inputs).logits, separate, atol=1e-6)
        finally:
            model.config.use_cache = True
            model.eval()


# ---- padding_free: a batch's examples flattened into one row ---------------------------------------------------


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_a_padding_free_row_scores_each_example_alone(
    family,
):
    """padding_free (issue 53, compared with packing where the data forces a padded length): the batch's examples one
    after another in one row, position ids restarting, no attention mask, the first label of each -100; its loss is
    the token-weighted mean of the examples alone, and its tensors are those of transformers' DataCollatorWithFlattening
    (what the export's train_snippet.py collates with)."""
    from transformers import DataCollatorWithFlattening

    from trainwise.training.data.tasks import Collator

    model, exs = tiny(family), examples(seed=3)
    batch = Collator("causal-lm", PAD, "none", 16, 8)(exs)
    hf = DataCollatorWithFlattening()([{"input_ids": ids, "labels": labels} for ids, labels in exs])
    assert set(batch.inputs) == {"input_ids", "position_ids"} and batch.inputs["input_ids"].shape[0] == 1
    for key in ("input_ids", "position_ids"):
        assert batch.inputs[key].tolist() == hf[key].tolist()
    assert batch.labels.tolist() == hf["labels"].tolist()
    real = sum(len(ids) for ids, _ in exs)
    assert (batch.n_samples, batch.real_tokens, batch.padded_tokens) == (len(exs), real, real)  # no padding
    with torch.no_grad():
        flat = model(**batch.inputs, labels=batch.labels, use_cache=False).loss
        sums, items = 0.0, 0
        for ids, labels in exs:
            logits = model(torch.tensor([ids]), use_cache=False).logits[0, :-1]
            target = torch.tensor(labels[1:])
            sums += float(F.cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="sum"))
            items += int((target != IGNORE_INDEX).sum())
    assert items == batch.loss_items and float(flat) == pytest.approx(sums / items, abs=1e-5)
