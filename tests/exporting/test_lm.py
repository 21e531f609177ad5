"""trainwise export for causal LMs: TRL's SFTTrainer (sft_train.py) and the HF Trainer (train_snippet.py), run as
written, train the losses of the study's trial, for each data form: prompt/response, raw text and chat.

The studies: llama-tiny (no dropout) on 16 prompt/response pairs with a batch of 16, so every step of either trainer
covers the whole training set and their sample order cannot change a step's loss; the packing trial's batch is the
number of packed rows, raw text's the number of blocks, for the same reason. Chat: 6 conversations in SmolLM2's
ChatML template on a 2-layer llama (`tiny_chat_model`), a batch of 6.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_csv
from tests.training.test_causal_lm import pairs
from tests.training.test_chat import IM_END, conversations
from trainwise import strategies
from trainwise.exporting.arguments import RunSettings, export_doc, sft_arguments
from trainwise.exporting.commands import train_command
from trainwise.exporting.scripts import write_export

STEPS = 4
# what third-party libraries print into a script's output unless it silences them first (DeepSpeed on a CPU, peft
# on transformers 5, bitsandbytes on a CPU): none may show
NOISE = ("real_accelerator.py", "is_gradient_checkpointing", "gemm_4bit_forward", "kernels-community", "pin_memory")


def plan_of(text: str):
    return strategies.parse_row(text, 2).plan


def _lm_study(root: Path, data: Path, rows: list[str], model_preset: str | None = "llama-tiny", **kw):
    """A causal-lm study (of llama-tiny unless `model` is given) on `data` (also its held-out file), every step the
    same seed and lr."""
    from trainwise.spec.config import StudyConfig
    from trainwise.study.prepare import prepare_study

    common = dict(task="causal-lm", model_preset=model_preset, max_steps=STEPS, warmup_steps=1, lr=3e-3)
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
    return _lm_study(root, data, rows, **pr, batch_size=16, accum_steps=2, max_length=64)


_TRIALS: dict[tuple[Path, str], tuple] = {}  # (study, row) -> (spec, losses): each trial runs once per session


def _trial_of(study, row: str) -> tuple:
    """Run the study's trial of `row` (its per-step losses; once, then remembered) and store it, so export --study
    finds it."""
    from trainwise.run.events import Step
    from trainwise.training.trial import run_trial

    if (study.out, row) not in _TRIALS:
        spec, losses = _spec_of(study, row), []
        run_trial(spec, progress=lambda e: losses.append(e.loss) if isinstance(e, Step) else None)
        _TRIALS[study.out, row] = spec, losses
    spec, losses = _TRIALS[study.out, row]
    _store(study, spec)
    return spec, losses


def _store(study, spec) -> None:
    """The trial of `spec` stored as run, so export --study finds it."""
    from trainwise.core.results import TrialResult
    from trainwise.study.store import Store

    store = Store(study.out / "study.sqlite")
    store.put(spec, TrialResult(spec.row, "ok"))
    store.close()
    (study.out / "results.json").write_text(json.dumps([{"strategy": spec.row, "row": spec.row}]))


def _spec_of(study, row: str):
    """The study's trial of `row`. A packing trial's batch is its number of packed rows, raw text's its number of
    blocks: every step then trains on every example, as the exported run's does."""
    from trainwise.training.data.prepared import load_data

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
    return spec


def _export(study, row: str, out: Path) -> None:
    from trainwise.api.export import export_plan
    from trainwise.exporting.scripts import ExportConfig

    export_plan(ExportConfig(study=str(study.out), strategies=row, device="cpu"), out)


def _run_sft(out: Path, here: pytest.MonkeyPatch | None = None) -> tuple[list[float], dict]:
    """sft_train.py as written (in its own process unless `here`), with an observer appended: the logged losses, and the
    first batch the trainer built (what carries loss, how positions run). Its output carries no third-party noise,
    and the trained model is saved into output_dir (the Trainer creates it: it is not left empty).
    With `here` (the test's monkeypatch), it runs in this process instead: TRL imported once, not once a test
    (~8 s on 2 cores); the noise is then checked by the tests that run it fresh (every script's quiet lines are
    the same, `_quiet_lines`)."""
    observer = (
        "\nbatch = next(iter(trainer.get_train_dataloader()))\n"
        "json.dump({'losses': [h['loss'] for h in trainer.state.log_history if 'loss' in h],\n"
        "           'batch': {k: batch[k].tolist() for k in ('input_ids', 'labels', 'position_ids') if k in batch},\n"
        "           'attention_mask': 'attention_mask' in batch}, open('observed.json', 'w'))\n"
    )
    (out / "observed_sft.py").write_text((out / "sft_train.py").read_text() + observer)
    if here is not None:
        here.chdir(out)
        script = (out / "observed_sft.py").read_text()
        exec(compile(script, str(out / "observed_sft.py"), "exec"), {"__name__": "__main__"})
    else:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("DS_ACCELERATOR", None)  # set here by the trials it ran: the script must quiet DeepSpeed itself
        done = subprocess.run(
            [sys.executable, "observed_sft.py"], cwd=out, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        noise = [line for line in (done.stdout + done.stderr).splitlines() if any(n in line for n in NOISE)]
        assert not noise, noise
    saved = {p.name for p in (out / "out").iterdir()}
    assert {"config.json", "model.safetensors"} <= saved or "adapter_model.safetensors" in saved, saved
    assert "tokenizer_config.json" in saved
    observed = json.loads((out / "observed.json").read_text())
    return observed["losses"], observed


@pytest.mark.slow
@pytest.mark.parametrize("row", ["baseline", "lora", "grad_accum"])
def test_sft_train_py_as_written_reproduces_the_trial_losses(tmp_path, lm_export_study, row, monkeypatch):
    """TRL's SFTTrainer on the exported files, step by step against compare's trial: the same prompt/response
    tokens with no loss on the prompt (completion_only_loss over a completion_mask), the same LoRA targets, the
    same mean over the loss tokens of an optimizer step."""
    study = lm_export_study
    spec, ours = _trial_of(study, row)
    out = tmp_path / "export"
    _export(study, row, out)
    config = json.loads((out / "sft_config.json").read_text())
    assert config["completion_only_loss"] is True and config["max_length"] == 64
    assert config["activation_checkpointing"] is False and config["bf16"] is False  # SFTConfig's defaults are on
    logged, observed = _run_sft(out, None if row == "lora" else monkeypatch)  # lora: fresh, the noisiest imports
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
def test_raw_text_sft_train_py_reproduces_the_trial_losses(tmp_path, text_study, monkeypatch):
    """Continued pre-training: the blocks as trainwise cuts them, every token a label (completion_only_loss off),
    through TRL's SFTTrainer."""
    spec, ours = _trial_of(text_study, "baseline")
    assert spec.settings.data_format == "text" and spec.settings.batch_size > 2
    out = tmp_path / "export"
    _export(text_study, "baseline", out)
    assert json.loads((out / "sft_config.json").read_text())["completion_only_loss"] is False
    logged, observed = _run_sft(out, monkeypatch)
    assert logged == pytest.approx(ours, rel=1e-4)
    assert ours[-1] < ours[0], "it trained"
    # every block's tokens carry loss (the first position of a block is never scored: nothing precedes it)
    ids, labels = observed["batch"]["input_ids"][0], observed["batch"]["labels"][0]
    assert [y for y in labels if y != -100] == ids[: len([y for y in labels if y != -100])]


@pytest.fixture(scope="module")
def chat_study(tmp_path_factory, tiny_chat_model):
    """Chat transcripts in a 'messages' column, in SmolLM2's ChatML template (which has no {% generation %}
    markers), on a 2-layer llama: 6 conversations of one or two exchanges, a batch of 6."""
    root = tmp_path_factory.mktemp("lm-chat")
    data = root / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations(6, seed=1)))
    kw = dict(model=str(tiny_chat_model), messages_column="messages", batch_size=6, accum_steps=1, max_length=96)
    return _lm_study(root, data, ["baseline"], model_preset=None, **kw)


@pytest.mark.slow
def test_chat_sft_train_py_reproduces_the_trial(tmp_path, chat_study, monkeypatch):
    """Issue 34: a chat study's sft_train.py trained each conversation's JSON text as a prompt whose only loss token
    was EOS. Now the conversations are rendered with the chat template and the loss is on the assistant turns
    only, labelled in the script as trainwise labels them (SmolLM2's template has no {% generation %} markers, so
    TRL's assistant_only_loss cannot): the trial's losses."""
    from transformers import AutoTokenizer

    from trainwise.training.data.chat import encode_chat
    from trainwise.training.data.prepared import read_prepared

    spec, ours = _trial_of(chat_study, "baseline")
    out = tmp_path / "export"
    _export(chat_study, "baseline", out)
    config = json.loads((out / "sft_config.json").read_text())
    assert config["completion_only_loss"] is True and "assistant_only_loss" not in config
    logged, observed = _run_sft(out, monkeypatch)
    assert len(logged) == len(ours) == STEPS
    assert logged == pytest.approx(ours, rel=1e-4)
    assert ours[-1] < ours[0], "it trained"
    # what TRL scores is exactly trainwise's labels: each assistant turn and its <|im_end|>, nothing else
    tokenizer = AutoTokenizer.from_pretrained(spec.settings.model_ref)
    rows, _, _ = read_prepared(spec.settings.data_dir)
    scored = sorted([y for y in labels if y != -100] for labels in observed["batch"]["labels"])
    assert scored == sorted([y for y in labels if y != -100] for labels in encode_chat(rows, tokenizer, 96).labels)
    turns = sum(m["role"] == "assistant" for row in rows for m in json.loads(row["text"]))
    assert tokenizer.decode([t for s in scored for t in s]).count(IM_END) == turns


def test_a_packed_chat_export_hands_trl_trainwise_s_packed_rows(tmp_path, monkeypatch, chat_study):
    """packing on chat data: the SFTTrainer that sft_train.py builds (as written; not trained here: TRL's packed
    training is compared with trainwise's step by step on prompt/response data below) holds trainwise's packed rows,
    the same examples binned the same way, their labels the assistant turns."""
    from trainwise.training.data.prepared import load_data

    spec = _spec_of(chat_study, "packing")
    _store(chat_study, spec)
    out = tmp_path / "export"
    _export(chat_study, "packing", out)
    assert not (out / "train_snippet.py").exists()  # the HF Trainer cannot pack
    monkeypatch.chdir(out)
    namespace: dict = {}
    exec(compile((out / "sft_train.py").read_text().split("trainer.train()")[0], "sft_train.py", "exec"), namespace)
    packed, _, _ = load_data(spec).packed()  # type: ignore[misc]

    def split(ids, labels, lengths):  # a TRL row's examples, at their lengths
        at = [0, *itertools.accumulate(lengths)]
        return sorted((tuple(ids[a:b]), tuple(labels[a:b])) for a, b in itertools.pairwise(at))

    trl = sorted(split(r["input_ids"], r["labels"], r["seq_lengths"]) for r in namespace["trainer"].train_dataset)
    ours = sorted(sorted((tuple(x), tuple(y)) for x, y in packed[i]) for i in range(len(packed)))
    assert trl == ours and 1 < len(ours) < spec.settings.n_train


MARKERS = (  # SmolLM2's template with {% generation %} around each assistant turn's content and <|im_end|>
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}",
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endif %}",
)


def test_generation_markers_hand_trl_the_conversations(tmp_path, monkeypatch, chat_study, tiny_chat_model):
    """Where TRL's own conversational path labels the conversations as trainwise does (a template whose
    {% generation %} spans are each assistant turn's content and end-of-turn token), sft_train.py hands TRL the
    messages with assistant_only_loss=True, and the SFTTrainer the script builds holds trainwise's tokens and
    labels. Where it does not (no markers, a conversation longer than --max-length, spans that are not the
    assistant turns), export writes the tokens and says why."""
    import shutil

    from transformers import AutoTokenizer

    from trainwise.exporting.scripts import chat_form
    from trainwise.training.data.chat import encode_chat, trl_labels_as_ours
    from trainwise.training.data.prepared import read_prepared

    marked = tmp_path / "marked"
    shutil.copytree(tiny_chat_model, marked)
    template = (marked / "chat_template.jinja").read_text()
    assert MARKERS[0] in template
    (marked / "chat_template.jinja").write_text(template.replace(*MARKERS))
    s = dataclasses.replace(chat_study.specs[0].settings, model_ref=str(marked))
    rows, _, _ = read_prepared(s.data_dir)
    tokenizer = AutoTokenizer.from_pretrained(marked)
    assert chat_form(s, f"{s.data_dir}/train.jsonl")[0] is True
    plain = AutoTokenizer.from_pretrained(tiny_chat_model)
    assert "no {% generation %} markers" in str(trl_labels_as_ours(plain, rows, 96))
    assert str(trl_labels_as_ours(tokenizer, rows, 40)).endswith(" is longer than --max-length 40")
    outside = " }}{% endgeneration %}{{ '<|im_end|>' }}"  # the end-of-turn token out of the span: TRL never trains it
    tokenizer.chat_template = tokenizer.chat_template.replace(" + '<|im_end|>' }}{% endgeneration %}", outside)
    assert "are not the assistant turns trainwise labels" in str(trl_labels_as_ours(tokenizer, rows, 96))

    run = RunSettings(
        str(marked), "causal-lm", 6, 96, 48, 3e-3, STEPS, device="cpu", train_rows=f"{s.data_dir}/train.jsonl",
        data_format="chat", chat_messages=True,
    )  # fmt: skip
    write_export(plan_of("baseline"), run, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "sft_config.json").read_text())
    assert config["assistant_only_loss"] is True and config["completion_only_loss"] is False
    monkeypatch.chdir(tmp_path / "export")
    namespace: dict = {}
    script = (tmp_path / "export" / "sft_train.py").read_text()
    assert "{'messages': json.loads(row['text'])}" in script
    exec(compile(script.split("trainer.train()")[0], "sft_train.py", "exec"), namespace)  # built, not trained
    prepared = namespace["trainer"].train_dataset
    ours = encode_chat(rows, AutoTokenizer.from_pretrained(marked), 96)
    assert [r["input_ids"] for r in prepared] == ours.input_ids and [r["labels"] for r in prepared] == ours.labels


@pytest.mark.slow
def test_packed_sft_train_py_matches_and_keeps_examples_apart(tmp_path, lm_export_study, monkeypatch):
    """packing -> SFTConfig(packing=True, packing_strategy='bfd', padding_free=True): TRL flattens a batch's packed
    rows into one row, position ids restarting per example and no attention mask, the label at every example's
    start -100. Were the examples to attend to each other, the losses would differ from trainwise's packed trial,
    whose examples are kept apart (tests/strategies/test_packing.py checks that trial against each example run
    alone)."""
    study = lm_export_study
    spec, ours = _trial_of(study, "packing")
    out = tmp_path / "export"
    _export(study, "packing", out)
    config = json.loads((out / "sft_config.json").read_text())
    assert (config["packing"], config["packing_strategy"], config["padding_free"]) == (True, "bfd", True)
    assert config["per_device_train_batch_size"] == spec.settings.batch_size
    logged, observed = _run_sft(out, monkeypatch)
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
@pytest.mark.parametrize(
    "form, row",
    [
        ("lm_export_study", "baseline"),
        ("lm_export_study", "dynamic_pad"),
        ("lm_export_study", "grad_accum"),
        ("text_study", "baseline"),
        ("chat_study", "baseline"),
    ],
)
def test_the_trainer_snippet_reproduces_the_trial_losses(tmp_path, monkeypatch, request, form, row):
    """train_snippet.py (the HF Trainer, no TRL): the trial's tokens and labels (-100 on the prompt; raw text's
    blocks, every token a label; a conversation's assistant turns only), the plan's padding."""
    study = request.getfixturevalue(form)
    spec, ours = _trial_of(study, row)
    out = tmp_path / "export"
    _export(study, row, out)
    command = (out / "train_command.txt").read_text()
    columns = {"lm_export_study": "--prompt-column question --response-column answer", "text_study": "--text-column"}
    assert f"--train-file {study.config.train_file}" in command
    assert columns.get(form, "--messages-column messages") in command
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


def test_raw_and_pair_scripts_tokenize_as_trainwise(tmp_path, lm_export_study):
    """Both scripts' data lines, run against the study's tokenizer, give trainwise's own encoding: raw text
    concatenated with EOS and cut into blocks (every token a label), prompt/response with -100 on the prompt."""
    from trainwise.exporting.scripts import _lm_data_lines
    from trainwise.training.data.prepared import read_prepared
    from trainwise.training.data.tasks import IGNORE_INDEX, encode_lm
    from trainwise.training.models import ModelSource, load_tokenizer

    s = lm_export_study.specs[0].settings
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


@pytest.mark.parametrize("mode", ["keep_start", "keep_end"])
def test_a_study_cut_as_trl_cuts_exports_the_same_cut(lm_export_study, mode):
    """A study whose trials cut as TRL does (`--truncation`, a study of an SFTConfig): the Trainer's lines give the
    trials' very examples (joined, cut, the fully masked dropped); TRL gets the rows as they are, with the study's
    truncation_mode in its config, and cuts them itself (tests/training/test_causal_lm.py checks TRL's cut is ours)."""
    from datasets import Dataset

    from trainwise.exporting.scripts import _lm_data_lines
    from trainwise.training.data.prepared import read_prepared
    from trainwise.training.data.tasks import trl_cut, trl_examples
    from trainwise.training.models import ModelSource, load_tokenizer

    s = lm_export_study.specs[0].settings
    tokenizer = load_tokenizer(ModelSource("preset", "llama-tiny"), s.tokenizer_dir)
    rows, _, _ = read_prepared(s.data_dir)
    for data_format in ("prompt_response", "text"):
        run = dataclasses.replace(
            LM, max_length=12, train_rows=f"{s.data_dir}/train.jsonl", data_format=data_format, truncation=mode
        )
        ours = trl_cut(trl_examples(rows, tokenizer, data_format), 12, mode)
        namespace: dict = {"tokenizer": tokenizer, "json": json, "Dataset": Dataset}
        exec("\n".join(_lm_data_lines(run, sft=False)), namespace)
        got = namespace["train_dataset"]
        assert [g["input_ids"] for g in got] == ours.input_ids and [g["labels"] for g in got] == ours.labels
        assert (len(got) < len(rows)) == (mode == "keep_start" and data_format == "prompt_response")
        exec("\n".join(_lm_data_lines(run, sft=True)), namespace)
        keys = {"prompt", "completion"} if data_format == "prompt_response" else {"text"}
        assert len(namespace["train_dataset"]) == len(rows) and set(namespace["train_dataset"][0]) == keys
        assert sft_arguments(export_doc(plan_of("baseline"), run), run)["truncation_mode"] == mode
    assert "--truncation keep_end" in train_command(dataclasses.replace(LM, truncation="keep_end"))


def test_chat_scripts_label_the_assistant_turns_as_trainwise(tmp_path, chat_tokenizer):
    """Both scripts' chat lines, run against SmolLM2's tokenizer, give trainwise's own encoding: the template
    rendered, the assistant turns labelled, a conversation longer than --max-length cut there and one left with no
    assistant token left out (at 40 tokens: 5 of 6 cut, 3 of them left out)."""
    from datasets import Dataset

    from trainwise.exporting.scripts import _lm_data_lines
    from trainwise.training.data.chat import IGNORE_INDEX, conversation_text, encode_chat

    rows = [{"text": conversation_text(m), "target": ""} for m in conversations(6, seed=1)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for max_length in (96, 40):
        ours = encode_chat(rows, chat_tokenizer, max_length)
        assert (ours.cut, ours.dropped) == ((5, 3) if max_length == 40 else (0, 0))
        run = dataclasses.replace(
            LM, max_length=max_length, train_rows=str(tmp_path / "train.jsonl"), data_format="chat"
        )
        for sft in (False, True):
            namespace: dict = {"tokenizer": chat_tokenizer, "json": json, "Dataset": Dataset}
            exec("\n".join(_lm_data_lines(run, sft)), namespace)
            got = list(namespace["train_dataset"])
            assert [g["input_ids"] for g in got] == ours.input_ids, (max_length, sft)
            if sft:
                masks = [zip(g["input_ids"], g["completion_mask"], strict=True) for g in got]
                labels = [[t if m else IGNORE_INDEX for t, m in row] for row in masks]
            else:
                labels = [g["labels"] for g in got]
            assert labels == ours.labels, (max_length, sft)


def test_new_weights_come_from_trainwise_s_seed(tiny_chat_model):
    """The scripts seed torch as trainwise does before loading a pretrained model, so the weights drawn after it
    (LoRA's) are the trial's: unseeded, a chat model's LoRA run moved the losses by 8e-4 from step 2."""
    import torch

    from trainwise.exporting.scripts import _model_part
    from trainwise.training.loop import apply_plan
    from trainwise.training.models import ModelSource, build_model

    run = dataclasses.replace(LM, model=str(tiny_chat_model), row="lora", seed=3)
    lines = _model_part(export_doc(plan_of("lora"), run), run, "AutoModelForCausalLM", {})
    namespace: dict = {}
    exec("\n".join(["import torch", "from transformers import AutoModelForCausalLM, AutoTokenizer", *lines]), namespace)
    rt = strategies.runtime(plan_of("lora"), "causal-lm", "cpu")
    ours = apply_plan(build_model(ModelSource("dir", str(tiny_chat_model)), "causal-lm", 2, 3, **rt.model_kwargs), rt)
    theirs = dict(namespace["model"].named_parameters())
    drawn = {name: p for name, p in ours.named_parameters() if "lora_A" in name}
    assert drawn and all(torch.equal(p, theirs[name]) for name, p in drawn.items())


def test_lora_exports_trainwise_targets_and_files_parse(tmp_path):
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
    from trainwise.core.errors import ConfigError

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
