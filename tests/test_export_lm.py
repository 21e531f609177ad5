"""trainwise export for causal LMs: TRL's SFTTrainer (sft_train.py) and the HF Trainer (train_snippet.py), run as
written, train the losses of the study's trial.

The study: llama-tiny (no dropout) on 16 prompt/response pairs with a batch of 16, so every step of either trainer
covers the whole training set and their sample order cannot change a step's loss; the packing trial's batch is the
number of packed rows, for the same reason.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainwise import strategies
from trainwise.export import RunSettings, export_doc, sft_arguments, write_export

from .conftest import write_csv
from .test_causal_lm import pairs

STEPS = 4


def plan_of(text: str):
    return strategies.parse_row(text, 2).plan


def _lm_study(root: Path, data: Path, rows: list[str], **kw):
    """A causal-lm study of llama-tiny on `data` (also its held-out file), every step the same seed and lr."""
    from trainwise.config import StudyConfig
    from trainwise.study import prepare_study

    common = dict(task="causal-lm", model_preset="llama-tiny", max_steps=STEPS, warmup_steps=1, lr=3e-3)
    common |= dict(eval_samples=0, device="cpu", remeasure=False, retries=0)
    return prepare_study(
        StudyConfig(out=str(root / "study"), strategies=rows, train_file=str(data), eval_file=str(data), **common, **kw)
    )


@pytest.fixture(scope="module")
def lm_export_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-export")
    data = write_csv(root / "pr.csv", pairs(16, seed=3))
    rows = ["baseline", "lora", "grad_accum", "dynamic_pad"]  # packing: from baseline (see _trial_of)
    pr = dict(prompt_column="question", response_column="answer")
    return _lm_study(root, data, rows, **pr, batch_size=16, accum_steps=2, max_length=64), data


def _trial_of(study, row: str) -> tuple:
    """Run the study's trial of `row` (its per-step losses) and store it, so export --study finds it. A packing
    trial's batch is its number of packed rows, raw text's its number of blocks: every step then trains on every
    example, as the exported run's does."""
    from trainwise.data.prepared import load_data
    from trainwise.results import TrialResult
    from trainwise.study import Store
    from trainwise.trial import run_trial

    if row == "packing":  # a study refuses packing rows fewer than its batch: the baseline's spec, packed
        base = next(s for s in study.specs if s.row == "baseline")
        spec = dataclasses.replace(base, row=row, plan=strategies.parse_row(row, base.settings.accum_steps).plan)
    else:
        spec = next(s for s in study.specs if s.row == row)
    if spec.plan.value("packing"):
        rows = len(load_data(spec).packed()[0])  # type: ignore[misc]
        assert 1 < rows < spec.settings.n_train, "the examples share rows"
        spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, batch_size=rows))
    elif spec.settings.data_format == "text":
        blocks = spec.settings.n_train  # trainwise counts the text's blocks of --max-length tokens
        spec = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, batch_size=blocks))
    losses: list[float] = []
    run_trial(spec, progress=lambda e: losses.append(e["loss"]) if e.get("event") == "step" else None)
    store = Store(study.out / "study.sqlite")
    store.put(spec, TrialResult(row, "ok"))
    store.close()
    (study.out / "results.json").write_text(json.dumps([{"strategy": r, "row": r} for r in [row]]))
    return spec, losses


def _export(study, row: str, out: Path) -> None:
    from trainwise.export import ExportConfig, export_plan

    export_plan(ExportConfig(study=str(study.out), strategies=row, device="cpu"), out)


def _run_sft(out: Path) -> tuple[list[float], dict]:
    """sft_train.py as written, in its own process, with an observer appended: the logged losses, and the
    first batch the trainer built (what carries loss, how positions run)."""
    observer = (
        "\nbatch = next(iter(trainer.get_train_dataloader()))\n"
        "json.dump({'losses': [h['loss'] for h in trainer.state.log_history if 'loss' in h],\n"
        "           'batch': {k: batch[k].tolist() for k in ('input_ids', 'labels', 'position_ids') if k in batch},\n"
        "           'attention_mask': 'attention_mask' in batch}, open('observed.json', 'w'))\n"
    )
    (out / "observed_sft.py").write_text((out / "sft_train.py").read_text() + observer)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "observed_sft.py"], cwd=out, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    observed = json.loads((out / "observed.json").read_text())
    return observed["losses"], observed


@pytest.mark.slow
@pytest.mark.parametrize("row", ["baseline", "lora", "grad_accum"])
def test_sft_train_py_as_written_reproduces_the_trial_losses(tmp_path, lm_export_study, row):
    """TRL's SFTTrainer on the exported files, step by step against compare's trial: the same prompt/response
    tokens with no loss on the prompt (completion_only_loss over a completion_mask), the same LoRA targets, the
    same mean over the loss tokens of an optimizer step."""
    study, _ = lm_export_study
    spec, ours = _trial_of(study, row)
    out = tmp_path / "export"
    _export(study, row, out)
    config = json.loads((out / "sft_config.json").read_text())
    assert config["completion_only_loss"] is True and config["max_length"] == 64
    assert config["activation_checkpointing"] is False and config["bf16"] is False  # SFTConfig's defaults are on
    logged, observed = _run_sft(out)
    assert len(logged) == len(ours) == STEPS
    # the true mean: SFTTrainer's loss is normalised by num_items_in_batch, and it logs it so under accumulation too
    assert spec.plan.value("accum_steps") == (2 if row == "grad_accum" else 1)
    assert logged == pytest.approx(ours, rel=1e-4), row
    assert ours[-1] < ours[0], "it trained"
    # the prompt carries no loss: what the trainer scores is exactly the response tokens and EOS of each pair
    eos = 2  # the trained tokenizer's
    for ids, labels in zip(observed["batch"]["input_ids"], observed["batch"]["labels"], strict=True):
        scored = [y for y in labels if y != -100]
        assert scored and scored[-1] == eos and len(scored) < sum(1 for t in ids if t != 0)


@pytest.fixture(scope="module")
def text_study(tmp_path_factory):
    """Raw text (continued pre-training): documents concatenated with EOS and cut into --max-length blocks."""
    root = tmp_path_factory.mktemp("lm-text")
    data = write_csv(root / "docs.csv", [{"body": f"{r['question']}. {r['answer']}."} for r in pairs(12, seed=5)])
    return _lm_study(root, data, ["baseline"], text_column="body", batch_size=2, accum_steps=1, max_length=48)


@pytest.mark.slow
def test_raw_text_sft_train_py_reproduces_the_trial_losses(tmp_path, text_study):
    """Continued pre-training: the blocks as trainwise cuts them, every token a label (completion_only_loss off),
    through TRL's SFTTrainer."""
    spec, ours = _trial_of(text_study, "baseline")
    assert spec.settings.data_format == "text" and spec.settings.batch_size > 2
    out = tmp_path / "export"
    _export(text_study, "baseline", out)
    assert json.loads((out / "sft_config.json").read_text())["completion_only_loss"] is False
    logged, observed = _run_sft(out)
    assert logged == pytest.approx(ours, rel=1e-4)
    assert ours[-1] < ours[0], "it trained"
    # every block's tokens carry loss (the first position of a block is never scored: nothing precedes it)
    ids, labels = observed["batch"]["input_ids"][0], observed["batch"]["labels"][0]
    assert [y for y in labels if y != -100] == ids[: len([y for y in labels if y != -100])]


@pytest.mark.slow
def test_packed_sft_train_py_reproduces_the_packed_trial_and_keeps_examples_apart(tmp_path, lm_export_study):
    """packing -> SFTConfig(packing=True, packing_strategy='bfd', padding_free=True): TRL flattens a batch's packed
    rows into one row, position ids restarting per example and no attention mask, the label at every example's
    start -100. Were the examples to attend to each other, the losses would differ from trainwise's packed trial,
    whose examples are kept apart (tests/test_packing.py checks that trial against each example run alone)."""
    study, _ = lm_export_study
    spec, ours = _trial_of(study, "packing")
    out = tmp_path / "export"
    _export(study, "packing", out)
    config = json.loads((out / "sft_config.json").read_text())
    assert (config["packing"], config["packing_strategy"], config["padding_free"]) == (True, "bfd", True)
    assert config["per_device_train_batch_size"] == spec.settings.batch_size
    logged, observed = _run_sft(out)
    batch = observed["batch"]
    assert not observed["attention_mask"] and len(batch["input_ids"]) == 1  # one flattened row
    positions = batch["position_ids"][0]
    starts = [i for i, p in enumerate(positions) if p == 0]
    assert len(starts) >= spec.settings.n_train  # every example restarts its positions (pads too, at the end)
    assert all(batch["labels"][0][i] == -100 for i in starts)
    assert len(logged) == len(ours) == STEPS
    assert logged == pytest.approx(ours, rel=1e-4)
    assert ours[-1] < ours[0], "it trained"


@pytest.mark.slow
@pytest.mark.parametrize("row", ["baseline", "dynamic_pad", "grad_accum"])
def test_the_causal_lm_trainer_snippet_as_written_reproduces_the_trial_losses(
    tmp_path, monkeypatch, lm_export_study, row
):
    """train_snippet.py (the HF Trainer, no TRL): the trial's tokens, -100 on the prompt, the plan's padding."""
    study, data = lm_export_study
    spec, ours = _trial_of(study, row)
    out = tmp_path / "export"
    _export(study, row, out)
    command = (out / "train_command.txt").read_text()
    assert f"--train-file {data}" in command and "--prompt-column question --response-column answer" in command
    monkeypatch.chdir(out)
    namespace: dict = {}
    exec(compile((out / "train_snippet.py").read_text(), "train_snippet.py", "exec"), namespace)
    logged = [h["loss"] for h in namespace["trainer"].state.log_history if "loss" in h]
    assert len(logged) == len(ours) == STEPS
    # the true mean under accumulation too: a causal LM's loss is normalised by num_items_in_batch (the x accum
    # steps that transformers 5.x logs for BERT/T5 classifiers does not happen here)
    assert spec.plan.value("accum_steps") == (2 if row == "grad_accum" else 1)
    assert logged == pytest.approx(ours, rel=1e-4), row


LM = RunSettings(
    model="HuggingFaceTB/SmolLM2-135M",
    task="causal-lm",
    batch_size=16,
    max_length=256,
    max_target_length=48,
    lr=2e-4,
    max_steps=100,
    device="cpu",
    row="baseline",
    train_rows="/data/train.jsonl",
    data_format="text",
)


@pytest.mark.parametrize("row", ["baseline", "bf16+grad_ckpt", "lora", "packing", "chunked_ce", "adafactor"])
def test_sft_config_json_is_accepted_by_trl(tmp_path, row):
    """sft_config.json builds a trl.SFTConfig that says what the plan says (SFTConfig's own defaults turn on
    activation checkpointing and bf16: export writes both out)."""
    from trl import SFTConfig

    plan = plan_of(row).to_dict()
    kwargs = sft_arguments(export_doc(plan_of(row), LM, str(tmp_path)), LM)
    args = SFTConfig(**kwargs)
    assert args.activation_checkpointing == plan["grad_ckpt"] and args.bf16 == (plan["precision"] == "bf16")
    assert args.packing == plan["packing"] and args.padding_free == plan["packing"]
    assert args.max_length == 256 and args.completion_only_loss is False  # raw text: every token carries loss
    assert args.pad_to_multiple_of == 256 and args.optim.value in ("adamw_torch", "adafactor")


def test_raw_text_and_prompt_response_scripts_tokenize_as_trainwise(tmp_path, lm_export_study):
    """Both scripts' data lines, run against the study's tokenizer, give trainwise's own encoding: raw text
    concatenated with EOS and cut into blocks (every token a label), prompt/response with -100 on the prompt."""
    from trainwise.data.prepared import read_prepared
    from trainwise.data.tasks import IGNORE_INDEX, encode_lm
    from trainwise.export import _lm_data_lines
    from trainwise.models import ModelSource, load_tokenizer

    study, _ = lm_export_study
    s = study.specs[0].settings
    tokenizer = load_tokenizer(ModelSource("preset", "llama-tiny"), s.tokenizer_dir)
    rows, _, _ = read_prepared(s.data_dir)
    for data_format in ("prompt_response", "text"):
        run = dataclasses.replace(LM, max_length=24, train_rows=f"{s.data_dir}/train.jsonl", data_format=data_format)
        ours = encode_lm(rows, tokenizer, data_format, 24)
        for sft in (False, True):
            namespace: dict = {"tokenizer": tokenizer, "json": json}
            if sft:
                from datasets import Dataset

                namespace["Dataset"] = Dataset
            exec("\n".join(_lm_data_lines(run, sft)), namespace)
            got = list(namespace["train_dataset"])
            assert [g["input_ids"] for g in got] == ours.input_ids, (data_format, sft)
            if sft and data_format == "prompt_response":
                masks = [zip(g["input_ids"], g["completion_mask"], strict=True) for g in got]
                labels = [[t if m else IGNORE_INDEX for t, m in row] for row in masks]
            else:
                labels = [g.get("labels", g["input_ids"]) for g in got]
            assert labels == ours.labels, (data_format, sft)


def test_causal_lm_lora_exports_trainwise_targets_and_files_parse(tmp_path):
    paths, notes = write_export(plan_of("lora+chunked_ce"), LM, tmp_path)
    assert {p.name for p in paths} >= {"sft_config.json", "sft_train.py", "training_args.json", "train_snippet.py"}
    for name in ("sft_train.py", "train_snippet.py"):
        text = (tmp_path / name).read_text()
        compile(text, name, "exec")
        assert "target_modules=LORA_TARGETS.get(model.config.model_type)" in text and "'gate_proj'" in text
        assert "AutoModelForCausalLM" in text and "attn_implementation='sdpa'" in text
    # the knobs with no TrainingArguments field say what each script does instead, never silently
    assert any(n.startswith("chunked_ce:") and "fused LM head" in n for n in notes)


def test_a_script_that_cannot_train_the_plan_is_not_written(tmp_path):
    """The HF Trainer cannot pack: a packing plan's export writes sft_train.py and no train_snippet.py (a note says
    why and what to run), and an earlier export's train_snippet.py in the same directory goes too, so that no script
    there trains something else. With no script left (no TRL script for a classifier), export refuses in one line."""
    from trainwise.errors import ConfigError

    write_export(plan_of("lora"), LM, tmp_path)
    assert (tmp_path / "train_snippet.py").is_file()
    paths, notes = write_export(plan_of("lora+packing"), LM, tmp_path)
    assert {p.name for p in paths} == {
        "training_args.json", "accelerate_config.yaml", "train_command.txt", "sft_config.json", "sft_train.py"
    }  # fmt: skip
    assert not (tmp_path / "train_snippet.py").exists()
    assert any(n.startswith("train_snippet.py not written: the HF Trainer has no packing") for n in notes), notes
    assert any(n.startswith("packing:") and "sft_train.py packs as trainwise does" in n for n in notes)
    classifier = dataclasses.replace(LM, task="classification", data_format="", train_rows=None)
    with pytest.raises(ConfigError, match=r"^'packing' cannot be exported as trainwise trains it \(train_snippet"):
        write_export(plan_of("packing"), dataclasses.replace(classifier, row="packing"), tmp_path / "cls")
    assert not (tmp_path / "cls").exists()
