"""`trainwise.plan(trainer=...)` (issue 59): the objects a notebook holds, saved once into the study, planned as
`--from-config` plans a file, answered as objects of the caller's own classes that the same trainer class trains."""

from __future__ import annotations

import json

import pytest

import trainwise
from trainwise.core.errors import ConfigError

pytest.importorskip("trl")


def _objects(tmp_path):
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig

    from trainwise.training.models import preset_config_kwargs, train_tokenizer

    pairs = [(f"what does package {i} do?", f"it provides tool number {i} for the system") for i in range(48)]
    data = Dataset.from_dict({"prompt": [p for p, _ in pairs], "completion": [c for _, c in pairs]})
    train_tokenizer([p + " " + c for p, c in pairs], "llama-tiny", tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(tmp_path / "tok")
    family, kwargs = preset_config_kwargs("llama-tiny")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **{**kwargs, "vocab_size": len(tok)}))
    args = SFTConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        gradient_checkpointing=True,
        max_length=32,
        use_cpu=True,
        report_to="none",
        max_steps=2,
        optim="adamw_torch",
        bf16=False,  # (SFTConfig's default is bf16, on a CPU without it too: emulated, several times slower)
    )
    return model, data, tok, args


def test_an_sfttrainer_in_memory_is_planned_and_its_class_trains_the_answer(tmp_path):
    """An SFTTrainer built from a datasets.Dataset in memory: saved once into OUT/yours, "yours" measured, the plan
    back as a new SFTConfig (only the changed fields differ from the caller's), which SFTTrainer trains."""
    from trl import SFTConfig, SFTTrainer

    model, data, tok, args = _objects(tmp_path)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    out = tmp_path / "plan"
    result = trainwise.plan(
        trainer=trainer,
        out=str(out),
        strategies="baseline",
        max_steps=3,
        warmup_steps=1,
        eval_samples=0,
        quality_check=False,
        ecosystem_default=False,
        max_trials=1,
        retries=0,
        trainer_rounds=0,  # (SFTTrainer's own timing of both files: tests/exporting/test_user_config.py)
        render=None,
    )
    assert (out / "yours" / "model" / "config.json").is_file() and (out / "yours" / "train.jsonl").is_file()
    # the arguments as TRL reads them back: not to_dict's masks of every *_token field ("<EOS_TOKEN>", which TRL then
    # looks for in the vocabulary), and no hub credential
    saved = json.loads((out / "yours" / "args.json").read_text())
    assert not [k for k, v in saved.items() if v == f"<{k.upper()}>"], saved
    assert saved["eos_token"] == args.eos_token and saved["hub_token"] is None
    assert result.yours is not None and result.yours["row"] != "baseline"
    assert result.plan is not None
    assert type(result.args) is SFTConfig and result.args is not args
    assert result.data_collator is None  # (SFTTrainer builds its collator from the new SFTConfig)
    changed = {name: now for name, _was, now in result.yours["changes"]}
    for name, now in changed.items():
        assert getattr(result.args, name) == now, name
    same = ("learning_rate", "max_length", "seed", "output_dir", "max_steps")
    assert all(getattr(result.args, k) == getattr(args, k) for k in same)
    assert "args" not in json.loads((out / "plan.json").read_text())  # the objects stay objects
    again = SFTTrainer(model=model, args=result.args, train_dataset=data, processing_class=tok)
    assert again.train().global_step == 2


def test_objects_trainwise_cannot_measure_are_one_line(tmp_path):
    model, data, tok, args = _objects(tmp_path)
    with pytest.raises(ConfigError, match="not a transformers PreTrainedModel"):
        trainwise.plan(model=object(), train_dataset=data, processing_class=tok, args=args, out=str(tmp_path / "o"))
    with pytest.raises(ConfigError, match="args= is required"):
        trainwise.plan(model=model, train_dataset=data, processing_class=tok, out=str(tmp_path / "o"))
    tokenised = data.map(lambda r: tok(r["prompt"]), remove_columns=["prompt", "completion"])
    with pytest.raises(ConfigError, match="no column TRL reads"):
        trainwise.plan(model=model, train_dataset=tokenised, processing_class=tok, args=args, out=str(tmp_path / "o"))
    with pytest.raises(ConfigError, match="is no transformers Trainer"):
        trainwise.plan(trainer=object(), out=str(tmp_path / "o"))


def test_compare_and_estimate_take_the_same_objects(tmp_path):
    """`trainwise.compare(model=obj, train_dataset=, processing_class=, args=)`: a study at the arguments' settings
    (2 x 4 is a batch of 8 in micro-batches of 2) with yours among its rows; `trainwise.estimate` on the same parts:
    the baseline and yours, from the model's config alone."""
    model, data, tok, args = _objects(tmp_path)
    out = tmp_path / "study"
    study = trainwise.compare(
        model=model, train_dataset=data, processing_class=tok, args=args, out=str(out), strategies="baseline",
        max_steps=2, warmup_steps=1, eval_samples=0, remeasure=False, retries=0, render=None,
    )  # fmt: skip
    assert [r.strategy for r in study.rows] == ["baseline"] and study.rows[0].status == "ok"
    said = study.settings
    assert "--batch-size 8 --max-length 32" in said["command"] and said["batch"].startswith("8 samples"), said
    from trainwise.api import from_objects

    found = from_objects.pop_objects({"model": model, "train_dataset": data, "processing_class": tok, "args": args})
    chosen = from_objects.compare(found, {"out": str(tmp_path / "rows")}, None, None, lambda o, _r: o)
    rows = chosen.strategies.split(",")
    assert rows[0] == "baseline" and "grad_accum=4" in rows[-1] and len(rows) > 2, rows  # the defaults, then yours
    report = trainwise.estimate(model=model, train_dataset=data, processing_class=tok, args=args, render=None)
    rows = [r for r, _e in report.estimates]
    assert rows[0] == "baseline" and "grad_ckpt" in rows[1] and "grad_accum=4" in rows[1], rows
    assert all(e.peak_bytes > 0 for _r, e in report.estimates)
    # a GPU's estimate on a machine without one: the device is the target, not refused; the model by its own name;
    # a field of the arguments yours leaves out is said
    model.config.name_or_path, args.lr_scheduler_type = "tiny/llama-sft", "cosine"
    gpu = trainwise.estimate(
        model=model,
        train_dataset=data,
        processing_class=tok,
        args=args,
        device="cuda",
        strategies="baseline",
        render=None,
    )
    assert gpu.device == "cuda" and gpu.model == "tiny/llama-sft", (gpu.device, gpu.model)
    assert any(n.startswith("your arguments: lr_scheduler_type='cosine'") for n in gpu.notes), gpu.notes
    with pytest.raises(ConfigError, match="args= is required"):
        trainwise.compare(model=model, train_dataset=data, processing_class=tok, out=str(tmp_path / "x"))


def test_a_notebooks_arguments_come_back_from_their_file_field_for_field(tmp_path):
    """The arguments saved for the plan (`arguments_file`) read back through `trl sft`'s own parser to the same values,
    field for field: nested dicts, a dtype, lists, a string of optimizer arguments, the tokens to_dict masks; the
    hub's secret is never written."""
    import dataclasses

    import torch
    from trl import SFTConfig
    from trl.scripts.sft import make_parser

    from trainwise.api.from_objects import arguments_file

    args = SFTConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        hub_token="secret",
        lr_scheduler_kwargs={"num_cycles": 2},
        model_init_kwargs={"dtype": torch.bfloat16},
        gradient_checkpointing_kwargs={"use_reentrant": False},
        accelerator_config={"split_batches": True},
        label_names=["labels"],
        optim_args="betas=(0.9,0.99)",
        use_cpu=True,
        bf16=False,
        report_to="none",
    )
    saved = {**arguments_file(args), "model_name_or_path": "m", "dataset_name": "d"}
    assert saved["hub_token"] is None and "secret" not in json.dumps(saved, default=str)
    (tmp_path / "args.json").write_text(json.dumps(saved, default=str))
    _script, back, _model, _mix = make_parser().parse_args_and_config(
        ["--config", str(tmp_path / "args.json")], fail_with_unknown_args=False
    )
    assert args.model_init_kwargs["dtype"] is torch.bfloat16, "the caller's own arguments are left as they were"

    def value(v: object) -> str:  # a dtype as TRL reads its name back ("bfloat16" loads as torch.bfloat16)
        return json.dumps(v, sort_keys=True, default=lambda o: str(o).removeprefix("torch."))

    differ = [
        f.name
        for f in dataclasses.fields(args)
        if f.init and f.name != "hub_token" and value(getattr(args, f.name)) != value(getattr(back, f.name))
    ]
    assert differ == [], [(n, getattr(args, n), getattr(back, n)) for n in differ]
