"""trainwise export: a plan in the forms users run it.

Every knob of the plan writes its own part (`trainwise.strategies.export_doc`); this module adds the
run's settings and renders the files:
- training_args.json: `transformers.TrainingArguments` keyword arguments, and train_snippet.py, the
  Python that uses them with the HF Trainer, including what TrainingArguments cannot say (padding /
  collator, freezing, LoRA, the weights' dtype), with a comment for each such knob;
- accelerate_config.yaml: for `accelerate launch --config_file`;
- ds_config.json: for ZeRO plans, with "auto" where the HF integration fills values from the arguments;
- train_command.txt: the equivalent `trainwise train` command;
- causal LMs also: sft_config.json (`trl.SFTConfig` keyword arguments: the TrainingArguments and TRL's own, packing
  and completion-only loss) and sft_train.py, the same run with TRL's SFTTrainer.
The notes (what TrainingArguments cannot say, and what the snippet does instead) are printed too. A script that
cannot train the plan as trainwise does (a knob's `ExportDoc.cannot`: the HF Trainer cannot pack) is not written,
and a note says why; with no training script left, export refuses (ConfigError). The scripts train on a study's
own rows, tokenized and labelled as its trials were (raw text, prompt/response, chat: `_lm_data_lines`).

Where the Trainer differs from trainwise's loop (documented in docs/export.md and pinned by a test):
transformers 5.x logs the training loss x accumulation steps for models that accept
`num_items_in_batch` (BERT, T5) while the optimisation itself is the same.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainwise.core.config import DEFAULT_LR, TrialSettings, check_nproc
from trainwise.core.errors import ConfigError, check_number
from trainwise.core.files import write_atomic
from trainwise.core.option import option, take
from trainwise.estimating.data import EstimateConfig
from trainwise.exporting.arguments import RunSettings, export_doc, sft_arguments
from trainwise.exporting.commands import train_command, train_out
from trainwise.spec.groups import Batch, Lengths, Model, Training
from trainwise.strategies.base import ExportDoc
from trainwise.strategies.knobs import TrialPlan
from trainwise.study.store import MARK, check_ours, mark
from trainwise.training.data.chat import trl_labels_as_ours
from trainwise.training.models import (
    CAUSAL_LM,
    ModelSource,
    load_tokenizer,
    preset_config_kwargs,
)

TRL_VERSION = "1.16.0"  # the TRL that sft_train.py is written for and tested with (trainwise[sft])
AUTO_CLASSES = {"seq2seq": "AutoModelForSeq2SeqLM", CAUSAL_LM: "AutoModelForCausalLM"}


def _trl_data_lines(s: RunSettings, sft: bool, lines: list[str]) -> list[str]:
    """A study whose trials cut its examples as TRL does (`--truncation`, a study of an SFTConfig): TRL gets the rows
    as they are and prepares them itself (its truncation_mode in sft_config.json); the HF Trainer gets them as TRL would
    (trainwise.training.data.tasks.trl_examples / trl_cut): text or prompt + response + EOS tokenized as one string,
    cut, and an example left with no loss token dropped."""
    prompted = s.data_format == "prompt_response"
    if sft:
        record = "{'prompt': row['text'], 'completion': row['target']}" if prompted else "{'text': row['text']}"
        return [
            *lines,
            f"# TRL tokenizes and cuts them itself (truncation_mode {s.truncation!r}), as the study's trials did",
            f"train_dataset = Dataset.from_list([{record} for row in rows])",
        ]
    cut = "[:MAX_LENGTH]" if s.truncation == "keep_start" else "[-MAX_LENGTH:]"
    if prompted:
        body = [
            "    ids = tokenizer(row['text'] + row['target'] + tokenizer.eos_token)['input_ids']",
            "    prompt = tokenizer(row['text'])['input_ids']",
            "    # the completion starts where the two tokenizations diverge (TRL's completion mask)",
            "    n = next((i for i, (a, b) in enumerate(zip(prompt, ids)) if a != b), min(len(prompt), len(ids)))",
            "    labels = [-100] * n + ids[n:]",
        ]
    else:
        body = ["    ids = tokenizer(row['text'] + tokenizer.eos_token)['input_ids']", "    labels = list(ids)"]
    return [
        *lines,
        f"MAX_LENGTH = {s.max_length}",
        "",
        "",
        "def encode(row):",
        f'    """As TRL\'s SFTTrainer prepares it (truncation_mode {s.truncation!r}): one string with EOS, cut."""',
        *body,
        f"    return {{'input_ids': ids{cut}, 'labels': labels{cut}}}",
        "",
        "",
        "# an example left with no loss token is dropped, as TRL drops it",
        "train_dataset = [x for x in map(encode, rows) if any(y != -100 for y in x['labels'])]",
    ]


def _data_lines(doc: ExportDoc, s: RunSettings) -> list[str]:
    """The snippet's training set: a study's own prepared rows (the same rows, in the same held-out split,
    that trainwise trained on), tokenized as the plan pads; without a study, a placeholder."""
    if s.task == CAUSAL_LM:
        return _lm_data_lines(s, sft=False)
    if s.train_rows is None:
        return [
            f"# tokenize with {doc.tokenize}",
            "train_dataset = ...  # your tokenized dataset (input_ids, attention_mask, labels)",
        ]
    lines = [
        f"# the study's training rows, prepared by trainwise from {s.origin.describe() if s.origin else 'its data'}",
        f"rows = [json.loads(line) for line in open({s.train_rows!r}, encoding='utf-8')]",
    ]
    if s.task == "classification":
        lines += [
            "",
            "def encode(row):",
            f"    features = tokenizer(row['text'], {doc.tokenize})",
            "    features['labels'] = model.config.label2id[row['target']]",
            "    return features",
        ]
    else:
        pad = ', padding="max_length"' if "padding" in doc.tokenize else ""
        lines += [
            "",
            "def encode(row):",
            f"    features = tokenizer(row['text'], {doc.tokenize})",
            f"    target = tokenizer(text_target=row['target'], truncation=True, "
            f"max_length={s.max_target_length}{pad})",
            "    features['labels'] = [t if t != tokenizer.pad_token_id else -100 for t in target['input_ids']]",
            "    return features",
        ]
    return [*lines, "", "train_dataset = [encode(row) for row in rows]"]


def _lm_data_lines(s: RunSettings, sft: bool) -> list[str]:
    """A causal LM's training set, tokenized as trainwise does (trainwise.training.data.tasks.encode_lm): no special
    tokens
    but an EOS after each response or document; prompt/response pairs with no loss on the prompt, raw text
    concatenated and cut into --max-length blocks, conversations rendered with the chat template and the loss on
    the assistant turns (`_chat_data_lines`). For the HF Trainer: input_ids and labels (-100: no loss); for TRL:
    input_ids and completion_mask, which SFTConfig(completion_only_loss=True) turns into those labels."""
    if s.train_rows is None:
        if sft:
            return [
                "# your data: a datasets.Dataset with 'prompt' and 'completion' columns (the loss on the completion",
                "# only), a 'messages' column of conversations (with assistant_only_loss=True in sft_config.json and",
                "# a chat template with {% generation %} markers) or a 'text' column. TRL tokenizes prompt +",
                "# completion as one string, so tokens merging across the boundary may differ from trainwise's, which",
                "# tokenizes them apart (export --study writes trainwise's tokenization here)",
                "train_dataset = ...",
            ]
        return [
            f"# tokenize without special tokens, EOS after each response; at most {s.max_length} tokens",
            "train_dataset = ...  # your tokenized dataset (input_ids, labels: -100 where no loss)",
        ]
    source = s.origin.describe() if s.origin else "its data"
    lines = [
        f"# the study's training rows, prepared by trainwise from {source}, tokenized as trainwise does",
        f"rows = [json.loads(line) for line in open({s.train_rows!r}, encoding='utf-8')]",
    ]
    if s.data_format == "chat":
        return _chat_data_lines(s, sft, lines)
    if s.truncation:
        return _trl_data_lines(s, sft, lines)
    lines += [f"MAX_LENGTH = {s.max_length}", "eos = tokenizer.eos_token_id"]
    if s.data_format == "text":
        lines += [
            "docs = tokenizer([row['text'] for row in rows], add_special_tokens=False)['input_ids']",
            "stream = [t for doc in docs for t in (*doc, eos)]  # every document ends with EOS",
            "blocks = [stream[i : i + MAX_LENGTH] for i in range(0, len(stream), MAX_LENGTH)]  # no token lost",
        ]
        if sft:
            return [*lines, "train_dataset = Dataset.from_list([{'input_ids': b} for b in blocks])  # loss on all"]
        return [*lines, "train_dataset = [{'input_ids': b, 'labels': b} for b in blocks]  # every token a label"]
    lines += [
        "",
        "def encode(row):",
        '    """(prompt ids, response ids + EOS), tokenized apart: a long pair loses the prompt\'s beginning first,',
        '    keeping half the row for the prompt\'s end when the response is longer than the room."""',
        "    prompt = tokenizer(row['text'], add_special_tokens=False)['input_ids']",
        "    response = tokenizer(row['target'], add_special_tokens=False)['input_ids'] + [eos]",
        "    keep = min(len(prompt), max(MAX_LENGTH - len(response), MAX_LENGTH // 2))",
        "    prompt = prompt[len(prompt) - keep :] if keep > 0 else []",
        "    return prompt, response[: MAX_LENGTH - len(prompt)]",
        "",
        "",
        "pairs = [encode(row) for row in rows]",
    ]
    if sft:
        return [
            *lines,
            "# already tokenized, so TRL keeps these tokens; completion_only_loss=True: no loss on the prompt",
            "train_dataset = Dataset.from_list(",
            "    [{'input_ids': p + r, 'completion_mask': [0] * len(p) + [1] * len(r)} for p, r in pairs]",
            ")",
        ]
    return [*lines, "train_dataset = [{'input_ids': p + r, 'labels': [-100] * len(p) + r} for p, r in pairs]"]


def _chat_data_lines(s: RunSettings, sft: bool, lines: list[str]) -> list[str]:
    """Conversations (each row's 'text': a conversation as JSON) labelled as trainwise labels them
    (trainwise.training.data.chat.encode_chat), written out: the chat template rendered prefix by prefix, the loss on
    each
    assistant turn's content and end-of-turn token, a conversation cut at --max-length and left out when no
    assistant token is left. Or, for TRL where it labels them the same (`RunSettings.chat_messages`), the
    conversations themselves with assistant_only_loss."""
    if sft and s.chat_messages:
        return [
            *lines,
            "# TRL's conversational format: SFTTrainer renders each conversation with the chat template, and",
            "# assistant_only_loss=True (sft_config.json) puts the loss on the template's {% generation %} spans:",
            "# on these conversations exactly the assistant turns trainwise trained on (export checked each one)",
            "train_dataset = Dataset.from_list([{'messages': json.loads(row['text'])} for row in rows])",
        ]
    lines += [
        f"MAX_LENGTH = {s.max_length}",
        "",
        "",
        "def render(messages, generation_prompt=False):",
        '    """The tokens of `messages` rendered by the chat template (which writes its own special tokens)."""',
        "    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)",
        "    return tokenizer(text, add_special_tokens=False)['input_ids']",
        "",
        "",
        "def encode(messages):",
        '    """(input ids, labels) of one conversation, the loss on the assistant turns only: each turn runs from',
        "    the end of the messages before it rendered with the generation prompt to the end of the messages through",
        "    it (its content and the template's end-of-turn token, less a newline the template adds after that",
        '    token). A conversation longer than MAX_LENGTH keeps its first MAX_LENGTH tokens."""',
        "    ids = render(messages)",
        "    labels = [-100] * len(ids)",
        "    special = set(tokenizer.all_special_ids)",
        "    for i, message in enumerate(messages):",
        "        if message['role'] != 'assistant':",
        "            continue",
        "        start, end = len(render(messages[:i], generation_prompt=True)), len(render(messages[: i + 1]))",
        "        while end > start and ids[end - 1] not in special and not tokenizer.decode([ids[end - 1]]).strip():",
        "            end -= 1",
        "        labels[start:end] = ids[start:end]",
        "    return ids[:MAX_LENGTH], labels[:MAX_LENGTH]",
        "",
        "",
        "examples = [encode(json.loads(row['text'])) for row in rows]  # 'text': the conversation, as JSON",
        "# cut with no assistant token left (position 0 is never scored): left out, as trainwise leaves it out",
        "examples = [(ids, labels) for ids, labels in examples if any(y != -100 for y in labels[1:])]",
    ]
    if sft:
        return [
            *lines,
            "# already tokenized, so TRL keeps these tokens; completion_only_loss=True: the loss where the mask is 1",
            "train_dataset = Dataset.from_list(",
            "    [{'input_ids': ids, 'completion_mask': [int(y != -100) for y in labels]} for ids, labels in examples]",
            ")",
        ]
    return [*lines, "train_dataset = [{'input_ids': ids, 'labels': labels} for ids, labels in examples]"]


def _model_part(doc: ExportDoc, s: RunSettings, auto: str, labels: dict[str, str]) -> list[str]:
    """The tokenizer and the model as trainwise builds them, with the plan's edits."""
    lines = _preset_lines(s, auto, labels, doc) if s.model_is_preset else _pretrained_lines(s, auto, labels, doc)
    if "quantization_config" in doc.model_kwargs:  # qlora
        lines.insert(0, "from transformers import BitsAndBytesConfig  # pip install bitsandbytes")
    if s.task == CAUSAL_LM:
        lines += [
            "model.config.use_cache = False  # trainwise trains without a key/value cache (packed rows need none)",
            "if tokenizer.pad_token is None:  # trainwise pads with EOS then: pads carry no loss and attend nowhere",
            "    tokenizer.pad_token = tokenizer.eos_token",
            'tokenizer.padding_side = "right"',
        ]
    return [*lines, *doc.model_lines]


def sft_script(doc: ExportDoc, s: RunSettings) -> str:
    """The Python that runs a causal LM's plan with TRL's SFTTrainer: the same model, tokens and arguments as
    train_snippet.py, with SFTConfig saying what TrainingArguments cannot (packing, completion-only loss)."""
    lines = [
        f"# exported by trainwise: plan {s.row!r} for TRL's SFTTrainer (pip install trl=={TRL_VERSION})",
        f"# {s.batch_line(doc)}",
        *(f"# {note}" for note in doc.notes),
        "# TRL computes the loss through a fused LM head in chunks, whatever the plan: the mean cross-entropy over",
        "# the loss tokens of the optimizer step, as trainwise does",
        *_quiet_lines(s),
        "import torch",
        "from datasets import Dataset",
        "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer",
        "from trl import SFTConfig, SFTTrainer",
        "",
        *_model_part(doc, s, "AutoModelForCausalLM", {}),
        *_lm_data_lines(s, sft=True),
        'args = SFTConfig(**json.load(open("sft_config.json")))',
        "trainer = SFTTrainer(model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer)",
        *_train_lines(doc),
        "",
    ]
    return "\n".join(lines)


def _quiet_lines(s: RunSettings) -> list[str]:
    """The scripts' imports, headed by what silences third-party noise at its source, before anything imports it
    (as trainwise/__init__.py and trainwise.training.loop do for trainwise's own runs)."""
    deepspeed = [  # a filter, not DS_ACCELERATOR=cpu: the same script runs on a GPU machine, where DeepSpeed must look
        "# DeepSpeed (imported by accelerate) says on stdout that it found no GPU: that one line is dropped",
        'logging.getLogger("DeepSpeed").addFilter(lambda r: not str(r.msg).startswith("Setting accelerator to CPU"))',
    ]
    return [
        "import json",
        "import logging",
        "import os",
        "import warnings",
        "",
        *deepspeed,
        "# bitsandbytes, imported by peft on a CPU: a warning that an optional Hub kernel is missing (it uses its own)",
        'logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)',
        "# peft reads transformers 5's deprecated alias is_gradient_checkpointing: a FutureWarning per model",
        'warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)',
        "",
    ]


def _train_lines(doc: ExportDoc) -> list[str]:
    """`trainer.train()` inside the plan's contexts, the trained model saved, then every rank leaves its process
    group."""
    lines, indent = [], ""
    for context in doc.train_contexts:
        lines.append(f"{indent}with {context}:")
        indent += "    "
    return [
        *lines,
        f"{indent}trainer.train()",
        f"trainer.save_model()  # the trained model (LoRA: its adapter) and tokenizer, into {doc.args['output_dir']}/",
        "if torch.distributed.is_initialized():  # every rank leaves cleanly (gloo may abort at exit otherwise)",
        "    torch.distributed.destroy_process_group()",
    ]


def snippet(doc: ExportDoc, s: RunSettings) -> str:
    """The Python that runs the plan with the HF Trainer: arguments, model, data, collator, notes."""
    auto = AUTO_CLASSES.get(s.task, "AutoModelForSequenceClassification")
    labels: dict[str, str] = {}
    if s.task == "classification" and s.labels:
        labels["num_labels"] = str(len(s.labels))
        labels["id2label"] = repr(dict(enumerate(s.labels)))
        labels["label2id"] = repr({label: i for i, label in enumerate(s.labels)})
    lines = [f"# exported by trainwise: plan {s.row!r}", f"# {s.batch_line(doc)}"]
    lines += [f"# {note}" for note in doc.notes]
    lines += [
        *_quiet_lines(s),
        "import torch",
        f"from transformers import (AutoConfig, AutoTokenizer, Trainer, TrainingArguments, {auto}, "
        f"{doc.collator.split('(')[0]})",
        "",
        *_model_part(doc, s, auto, labels),
        *_data_lines(doc, s),
        'args = TrainingArguments(**json.load(open("training_args.json")))',
        f"data_collator = {doc.collator}",
        "trainer = Trainer(",
        "    model=model,",
        "    args=args,",
        "    train_dataset=train_dataset,",
        "    data_collator=data_collator,",
        "    processing_class=tokenizer,  # saved with the model",
        ")",
        *_train_lines(doc),
        *_LOGGED_LOSS.get(s.task, _LOGGED_LOSS["classification"]),
        "",
    ]
    return "\n".join(lines)


_LOGGED_LOSS = {  # what the Trainer's logged loss is, against trainwise's (tests/exporting/ pins both)
    "classification": [
        "# note: transformers 5.x logs loss x gradient_accumulation_steps for BERT/T5-style models;",
        "# the optimisation is the same as trainwise's (see trainwise docs/export.md).",
    ],
    CAUSAL_LM: ["# the logged loss is the mean over the loss tokens of each optimizer step, as trainwise reports it"],
}


def _pretrained_lines(s: RunSettings, auto: str, labels: dict[str, str], doc: ExportDoc) -> list[str]:
    args = "".join(f", {k}={v}" for k, v in {**doc.model_kwargs, **labels}.items())
    return [
        f"tokenizer = AutoTokenizer.from_pretrained({s.model!r})",
        f"torch.manual_seed({s.seed})  # the seed trainwise builds the model with: LoRA's new weights (a new head) too",
        f"model = {auto}.from_pretrained({s.model!r}{args})",
    ]


def _preset_lines(s: RunSettings, auto: str, labels: dict[str, str], doc: ExportDoc) -> list[str]:
    """A size preset as trainwise builds it: the architecture from its config (written out here, so nothing
    is downloaded), random weights from the run's seed, and the tokenizer the study trained on its data."""

    family, kwargs = preset_config_kwargs(s.model)
    config_args = ", ".join([*(f"{k}={v!r}" for k, v in kwargs.items()), *(f"{k}={v}" for k, v in labels.items())])
    model_kwargs = dict(doc.model_kwargs)
    quantized = model_kwargs.pop("quantization_config", None)  # from_config cannot quantize: from_pretrained can
    args = "".join(f", {k}={v}" for k, v in model_kwargs.items())
    if s.tokenizer_dir is not None:
        tokenizer = [f"tokenizer = AutoTokenizer.from_pretrained({s.tokenizer_dir!r})  # trained by the study"]
    else:  # no study, no data to train one on: the preset's vocabulary and special ids say what it must be
        tokenizer = [
            f"# {s.model} has no pretrained tokenizer: trainwise trains a byte-level BPE on the study's texts "
            f"(export --study writes its path here); yours needs at most {kwargs['vocab_size']} tokens, pad id 0",
            "tokenizer = ...  # your tokenizer",
        ]
    return [
        *tokenizer,
        f"# the {s.model} preset: its architecture, with random weights (no checkpoint to download)",
        f"config = AutoConfig.for_model({family!r}, {config_args})",
        f"torch.manual_seed({s.seed})  # the seed trainwise builds the random weights with",
        f"model = {auto}.from_config(config{args})",
        *(
            [
                'model.save_pretrained("preset_base")  # qlora: the random weights, reloaded with 4-bit NF4 layers',
                f'model = {auto}.from_pretrained("preset_base", quantization_config={quantized}{args})',
            ]
            if quantized
            else []
        ),
    ]


SCRIPTS = ("train_snippet.py", "sft_train.py")  # the training scripts (what runs the plan)
CONFIGS = ("training_args.json", "accelerate_config.yaml", "train_command.txt", "ds_config.json", "sft_config.json")


def write_export(plan: TrialPlan, s: RunSettings, out: Path, force: bool = False) -> tuple[list[Path], list[str]]:
    """Write the files; returns them and the notes (what TrainingArguments cannot say). A directory that
    holds files trainwise did not write (say, the user's own training_args.json) is refused unless `force`.
    A script that cannot train the plan as trainwise does is not written (a note says why); with none left, the
    export is refused. An earlier export's files that this one does not write are removed from a directory of
    trainwise's, so that none is left to train something else."""

    check_ours(out, force)
    doc = export_doc(plan, s)
    written = [name for name in SCRIPTS if name not in doc.cannot and (name == SCRIPTS[0] or s.task == CAUSAL_LM)]
    if not written:
        why = "; ".join(f"{name}: {reason}" for name, reason in doc.cannot.items())
        raise ConfigError(f"{s.row!r} cannot be exported as trainwise trains it ({why})")
    ours = (out / MARK).is_file()
    out.mkdir(parents=True, exist_ok=True)
    mark(out)
    files: dict[str, str] = {
        "training_args.json": json.dumps(doc.args, indent=2) + "\n",
        "train_snippet.py": snippet(doc, s),
        "accelerate_config.yaml": _yaml(doc.accelerate),
        "train_command.txt": train_command(s, train_out(out, s.row)) + "\n",
    }
    if doc.ds_config is not None:
        files["ds_config.json"] = json.dumps(doc.ds_config, indent=2) + "\n"
    notes = list(doc.notes)
    if s.task == CAUSAL_LM:
        files["sft_config.json"] = json.dumps(sft_arguments(doc, s), indent=2) + "\n"
        files["sft_train.py"] = sft_script(doc, s)
        if importlib.util.find_spec("trl") is None:
            notes.append(
                f"sft_train.py needs TRL, not installed here: pip install 'trainwise[sft]' (trl=={TRL_VERSION})"
            )
    for name, reason in doc.cannot.items():
        files.pop(name, None)
        notes.append(f"{name} not written: {reason}; run {' or '.join(written)}")
    paths = []
    for name, text in files.items():
        write_atomic(out / name, text)
        paths.append(out / name)
    if ours:  # an earlier export's script or config that this plan does not have would train something else
        for name in (*SCRIPTS, *CONFIGS):
            if name not in files:
                (out / name).unlink(missing_ok=True)
    data = [f"data: {s.origin.describe()}"] if s.origin is not None else []
    return paths, [*data, s.batch_line(doc), *notes]


def _yaml(d: dict) -> str:

    return yaml.safe_dump(d, sort_keys=False)


# ---- the verb ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ExportConfig(Lengths, Batch, Model):
    """One `trainwise export`: a plan and its settings (the model, the batch and the lengths: a study's groups,
    trainwise/spec/groups.py), or a study to take them from."""

    task: str = take(EstimateConfig, "task")  # a text task: the scripts build a transformers model
    study: str | None = option(None, "Model and settings from this study; the plan: advise's pick.")
    strategies: str | None = option(None, "The plan to export, one '+' combination, e.g. bf16+grad_ckpt.")
    lr: float = option(DEFAULT_LR["classification"], "Peak learning rate (linear decay).")
    # None: the study's (with --study), else 1000
    max_steps: int | None = option(None, "Steps of the exported run \\[default: the study's, else 1000].")
    nproc: int | None = option(None, "Data-parallel ranks \\[default: the study's, else 1].")  # as max_steps
    zero: int = take(EstimateConfig, "zero")
    offload: str = take(EstimateConfig, "offload")
    device: str = option("cuda", "Where the exported run trains: cuda or cpu.")
    force: bool = take(Training, "force")  # write into an --out that holds files trainwise did not write

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ConfigError(f"--device must be cuda or cpu, not {self.device!r}")
        if self.study is None:
            check_exportable(self.task)
        if self.max_steps is not None and self.max_steps <= 0:
            raise ConfigError(f"--max-steps must be > 0, got {self.max_steps}")
        check_number("--lr", self.lr)
        if self.nproc is not None:
            check_nproc(self.nproc)
        if self.study is None and self.strategies is None:
            raise ConfigError("--strategies is required without --study (e.g. --strategies bf16+grad_ckpt)")
        if self.strategies is not None and "," in self.strategies:
            raise ConfigError(
                f"--strategies {self.strategies!r}: export takes one plan (a '+' combination), not a list"
            )


def check_exportable(task: str) -> None:
    """The exported scripts build a transformers model; image-classification trains trainwise's own ResNeXt."""
    if task == "image-classification":
        raise ConfigError(
            "export writes transformers scripts (TrainingArguments, the HF Trainer, TRL), which cannot build "
            "trainwise's ResNeXt: train an image-classification plan with `trainwise train --task "
            "image-classification`"
        )


def chat_form(s: TrialSettings, train_rows: str | None) -> tuple[bool, str]:
    """A chat study's export: (whether sft_train.py hands TRL the conversations, the note saying which form and
    why). TRL's own conversational path only where it labels every training conversation as trainwise did."""
    from trainwise.training.data.prepared import read_prepared  # heavy: trainwise.training.data.prepared loads torch

    if train_rows is None:
        return False, ""
    try:
        tokenizer = load_tokenizer(ModelSource(s.model_kind, s.model_ref), None)
    except Exception as e:  # a model directory moved or deleted since the study
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot load the tokenizer of the study's model {s.model_ref}: {first}") from None
    train, _, _ = read_prepared(s.data_dir)
    why = trl_labels_as_ours(tokenizer, train, s.max_length)
    if why is None:
        return True, (
            "chat: sft_train.py hands TRL the conversations ('messages', assistant_only_loss=True): the chat "
            "template's {% generation %} spans are the assistant turns trainwise trained on, in every training "
            "conversation (checked)"
        )
    return False, (
        f"chat: sft_train.py hands TRL the tokens and a completion_mask, labelled in the script as trainwise does "
        f"(the assistant turns), not the conversations: {why}"
    )
