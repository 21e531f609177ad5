"""trainwise export: a plan in the forms users run it.

From one TrialPlan and the run's settings this writes:
- training_args.json: `transformers.TrainingArguments` keyword arguments (checked against the installed
  TrainingArguments signature), and train_snippet.py, the Python that uses them with the HF Trainer,
  including what TrainingArguments cannot say (padding / collator, freezing);
- accelerate_config.yaml: for `accelerate launch --config_file`;
- ds_config.json: for ZeRO plans, with "auto" where the HF integration fills values from the arguments;
- train_command.txt: the equivalent `trainwise train` command.

Where the Trainer differs from trainwise's loop (documented in README and pinned by a test):
transformers 5.x logs the training loss x accumulation steps for models that accept
`num_items_in_batch` (BERT, T5) while the optimisation itself is the same.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from trainwise.errors import ConfigError
from trainwise.plan import TrialPlan

OPTIM_NAMES = {
    "adamw": "adamw_torch",
    "adamw_foreach": "adamw_torch",  # torch's default on CUDA is for-each already
    "adamw_fused": "adamw_torch_fused",
    "adafactor": "adafactor",
    "adamw_8bit": "adamw_bnb_8bit",
}


@dataclass(frozen=True)
class RunSettings:
    """What an exported plan needs besides the plan itself."""

    model: str  # what the user passes to from_pretrained / --model (or a preset name)
    task: str
    batch_size: int  # effective, per device
    max_length: int
    max_target_length: int
    lr: float
    max_steps: int
    seed: int = 0
    max_grad_norm: float = 1.0
    num_workers: int = 0
    nproc: int = 1
    device: str = "cuda"
    model_is_preset: bool = False
    row: str = "baseline"


def training_arguments(plan: TrialPlan, s: RunSettings, output_dir: str = "out") -> dict:
    """TrainingArguments kwargs that reproduce the plan (its loop, its schedule, its optimizer)."""
    if plan.optimizer not in OPTIM_NAMES:
        raise ConfigError(f"no TrainingArguments optimizer for {plan.optimizer!r}")
    args: dict = {
        "output_dir": output_dir,
        "per_device_train_batch_size": plan.micro_batch_size(s.batch_size),
        "gradient_accumulation_steps": plan.accum_steps,
        "learning_rate": s.lr,
        "max_steps": s.max_steps,
        "lr_scheduler_type": "linear",
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_grad_norm": s.max_grad_norm,
        "optim": OPTIM_NAMES[plan.optimizer],
        "seed": s.seed,
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        "gradient_checkpointing": plan.grad_ckpt,
        "dataloader_num_workers": s.num_workers,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }
    if plan.grad_ckpt:
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    if plan.sampler == "length_grouped":
        args["train_sampling_strategy"] = "group_by_length"  # transformers 5 (was group_by_length=True)
    if s.device == "cpu":
        args["use_cpu"] = True
    if plan.zero_stage:
        args["deepspeed"] = "ds_config.json"
    if plan.compile:
        args["torch_compile"] = True
    if plan.empty_cache_steps:
        args["torch_empty_cache_steps"] = plan.empty_cache_steps
    return args


def ds_config(plan: TrialPlan) -> dict | None:
    """DeepSpeed config for a ZeRO plan ("auto": filled in by the HF / accelerate integration)."""
    if not plan.zero_stage:
        return None
    zero: dict = {"stage": plan.zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if plan.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload == "params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if plan.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }


def accelerate_config(plan: TrialPlan, s: RunSettings) -> dict:
    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[plan.precision]
    config: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "mixed_precision": mixed,
        "num_machines": 1,
        "num_processes": s.nproc,
        "machine_rank": 0,
        "gradient_accumulation_steps": plan.accum_steps,
        "use_cpu": s.device == "cpu",
    }
    if plan.zero_stage:
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "deepspeed_config_file": "ds_config.json",
            "zero3_init_flag": plan.zero_stage == 3,
        }
    elif s.nproc > 1:
        # MULTI_GPU launches N ranks (gloo when no GPU is visible). On CPU, use_cpu / --cpu would make
        # `accelerate launch` run ONE process despite num_processes, so it is left off.
        config["distributed_type"] = "MULTI_GPU"
        config["use_cpu"] = False
    else:
        config["distributed_type"] = "NO"
    return config


def train_command(s: RunSettings) -> str:
    model_flag = ["--model-preset", s.model] if s.model_is_preset else ["--model", s.model]
    argv = [
        "trainwise",
        "train",
        "--strategies",
        s.row,
        *model_flag,
        "--task",
        s.task,
        "--batch-size",
        str(s.batch_size),
        "--max-length",
        str(s.max_length),
        *(["--max-target-length", str(s.max_target_length)] if s.task == "seq2seq" else []),
        "--lr",
        str(s.lr),
        "--seed",
        str(s.seed),
    ]
    return shlex.join(argv)


def snippet(plan: TrialPlan, s: RunSettings) -> str:
    """The Python that runs the plan with the HF Trainer: arguments, collator, freezing."""
    auto = "AutoModelForSeq2SeqLM" if s.task == "seq2seq" else "AutoModelForSequenceClassification"
    collator = (
        "DataCollatorForSeq2Seq(tokenizer, model=model)"
        if s.task == "seq2seq"
        else "DataCollatorWithPadding(tokenizer)"
    )
    if plan.padding == "max_length":
        pad_line = (
            f'# padding="max_length" (max_length={s.max_length}) in your tokenize function, as this plan measured'
        )
        collator = "default_data_collator"
    else:
        pad_line = f"# pad per batch: tokenize with truncation=True, max_length={s.max_length}, and no padding"
    freeze_lines = []
    for part in plan.freeze:
        if part == "embeddings":
            freeze_lines.append("for p in model.get_input_embeddings().parameters(): p.requires_grad_(False)")
        elif part == "encoder":
            enc = "model.get_encoder()" if s.task == "seq2seq" else "model.base_model.encoder"
            freeze_lines.append(f"for p in {enc}.parameters(): p.requires_grad_(False)")
    if plan.freeze_layers:
        n = "len(stack) // 2" if plan.freeze_layers < 0 else str(plan.freeze_layers)
        stack = "model.get_encoder().block" if s.task == "seq2seq" else "model.base_model.encoder.layer"
        freeze_lines += [
            f"stack = {stack}  # the layer list (BART: .layers)",
            "for p in model.get_input_embeddings().parameters(): p.requires_grad_(False)",
            f"for layer in stack[:{n}]:",
            "    for p in layer.parameters(): p.requires_grad_(False)",
        ]
    if plan.offload_activations:
        freeze_lines.append(
            "# offload_activations: run training under torch.autograd.graph.save_on_cpu(pin_memory=True)"
        )
    if plan.lora_r:
        peft_task = "SEQ_2_SEQ_LM" if s.task == "seq2seq" else "SEQ_CLS"
        freeze_lines += [
            "from peft import LoraConfig, get_peft_model  # pip install peft",
            f"model = get_peft_model(model, LoraConfig(r={plan.lora_r}, lora_alpha={2 * plan.lora_r}, "
            f'lora_dropout=0.0, task_type="{peft_task}"))  # peft picks the attention projections',
        ]
    model_ref = s.model if not s.model_is_preset else f"<a directory with the {s.model} config>"
    attn = "" if plan.attn == "default" else f", attn_implementation={plan.attn!r}"
    return "\n".join(
        [
            f"# exported by trainwise: plan {s.row!r}",
            "import json",
            f"from transformers import (AutoTokenizer, Trainer, TrainingArguments, {auto}, {collator.split('(')[0]})",
            "",
            f"tokenizer = AutoTokenizer.from_pretrained({model_ref!r})",
            f"model = {auto}.from_pretrained({model_ref!r}{attn})",
            *freeze_lines,
            pad_line,
            "train_dataset = ...  # your tokenized dataset (input_ids, attention_mask, labels)",
            'args = TrainingArguments(**json.load(open("training_args.json")))',
            f"data_collator = {collator}",
            "trainer = Trainer(model=model, args=args, train_dataset=train_dataset, data_collator=data_collator)",
            "trainer.train()",
            "# note: transformers 5.x logs loss x gradient_accumulation_steps for BERT/T5-style models;",
            "# the optimisation is the same as trainwise's (see trainwise README, 'export').",
            "",
        ]
    )


def write_export(plan: TrialPlan, s: RunSettings, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {
        "training_args.json": json.dumps(training_arguments(plan, s), indent=2) + "\n",
        "train_snippet.py": snippet(plan, s),
        "accelerate_config.yaml": _yaml(accelerate_config(plan, s)),
        "train_command.txt": train_command(s) + "\n",
    }
    ds = ds_config(plan)
    if ds is not None:
        files["ds_config.json"] = json.dumps(ds, indent=2) + "\n"
    paths = []
    for name, text in files.items():
        path = out / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        paths.append(path)
    return paths


def _yaml(d: dict) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False)
