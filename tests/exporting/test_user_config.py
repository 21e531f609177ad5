"""Issue 59: your own training config in, the same config out. An SFTConfig YAML as `trl sft --config` reads it and a
TrainingArguments JSON as `to_json_string()` writes it: read and checked, made a study and a row ("yours"), and
written back with only the plan's fields changed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from tests import here
from trainwise.core.errors import ConfigError
from trainwise.exporting import user_config as uc
from trainwise.search.plan_inputs import plan_of, split_row, validity

SLOW_SFT = {  # common and deliberately slow: batch 2 x accumulation 8, checkpointing on, no packing, fp32 on the CPU
    "model_name_or_path": "HuggingFaceTB/SmolLM2-135M",
    "dataset_name": "pairs.csv",
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 8,
    "gradient_checkpointing": True,
    "packing": False,
    "bf16": False,
    "use_cpu": True,
    "max_length": 128,
    "learning_rate": 2.0e-5,
    "output_dir": "out",
    "logging_steps": 10,
    "lr_scheduler_type": "cosine",
}


def _pairs(where: Path, n: int = 64) -> Path:
    path = where / "pairs.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt", "completion"])
        for i in range(n):
            w.writerow([f"Summarise item {i}: " + "word " * (5 + i % 17), f"item {i} in short"])
    return path


def _sft(where: Path, **changes) -> Path:
    _pairs(where)
    path = where / "sft.yaml"
    path.write_text(yaml.safe_dump({**SLOW_SFT, **changes}, sort_keys=False))
    return path


def _valid(task: str):
    runnable = validity(task, 1, set())
    return lambda row: runnable(split_row(row)[0]) if row != "baseline" else None


def test_an_sftconfig_yaml_is_a_study_and_a_row(tmp_path):
    """The effective batch is kept (2 x 8 = 16), the micro-batches are grad_accum=8, each switch the file (or TRL's
    own default) turns on is its strategy, the data's columns are TRL's, and a field the trials cannot reproduce is
    named, not dropped."""
    cfg = uc.read(_sft(tmp_path))
    assert cfg.kind == uc.SFT
    r = uc.reading(cfg, "cpu", _valid("causal-lm"))
    assert r.options["batch_size"] == 16 and r.options["accum_steps"] == 8 and r.options["task"] == "causal-lm"
    assert r.options["lr"] == 2e-5 and r.options["max_length"] == 128 and r.options["device"] == "cpu"
    assert r.options["truncation"] == "keep_start"  # TRL's default cut: the trials cut and drop as `trl sft` will
    assert (
        uc.reading(uc.read(_sft(tmp_path, truncation_mode="keep_end")), "cpu", _valid("causal-lm")).options[
            "truncation"
        ]
        == "keep_end"
    )
    assert r.options["train_file"] == str(tmp_path / "pairs.csv")
    assert (r.options["prompt_column"], r.options["response_column"]) == ("prompt", "completion")
    names = split_row(r.row)[0]
    assert {"grad_accum=8", "grad_ckpt", "adamw_fused", "chunked_ce", "dynamic_pad"} <= names, r.row
    assert "packing" not in names and "bf16" not in names  # bf16 false in the file: fp32
    assert r.said["grad_ckpt"] == "gradient_checkpointing=True"
    assert any(u.startswith("lr_scheduler_type='cosine'") for u in r.unhonoured), r.unhonoured


def test_the_plan_goes_back_into_the_same_file_with_only_its_fields_changed(tmp_path):
    """2 x 8 becomes 16 x 1, checkpointing goes off under the name the file used, packing on; every other line is
    the user's, and the file is YAML still."""
    cfg = uc.read(_sft(tmp_path))
    plan = plan_of(["packing", "chunked_ce", "adamw_fused"], 8)
    assert plan is not None
    written = uc.write_back(cfg, plan, 16, "causal-lm", 128, tmp_path)
    new = yaml.safe_load(written.path.read_text())
    assert written.path.name == "plan.sft.yaml"
    assert new["per_device_train_batch_size"] == 16 and new["gradient_accumulation_steps"] == 1
    assert new["gradient_checkpointing"] is False and "activation_checkpointing" not in new
    assert new["packing"] is True
    changed = {k: (a, b) for k, a, b in written.changes}
    assert {k: v for k, v in new.items() if k in SLOW_SFT and k not in changed} == {
        k: v for k, v in SLOW_SFT.items() if k not in changed
    }
    assert changed["per_device_train_batch_size"] == (2, 16) and "optim" not in changed  # fused: TRL's default
    assert "per_device_train_batch_size 2 -> 16" in written.line() and "gradient_checkpointing true -> false" in (
        written.line()
    )


def test_the_same_plan_as_the_file_changes_nothing(tmp_path):
    cfg = uc.read(_sft(tmp_path))
    r = uc.reading(cfg, "cpu", _valid("causal-lm"))
    plan = plan_of(split_row(r.row)[0], 8)
    assert plan is not None
    written = uc.write_back(cfg, plan, 16, "causal-lm", 128, tmp_path)
    assert written.changes == [], written.changes


def test_a_trainingarguments_json_dump_is_read_as_the_trainer(tmp_path):
    """`TrainingArguments(...).to_json_string()` as written: every field, most at their defaults; the trainer's
    file keeps its own format (JSON) and kind (no SFT fields)."""
    from transformers import TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path / "o"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=8,
        gradient_checkpointing=True,
        use_cpu=True,
        learning_rate=3e-5,
        report_to="none",
        lr_scheduler_type="cosine",
    )
    path = tmp_path / "training_args.json"
    path.write_text(args.to_json_string())
    cfg = uc.read(path, "classification")
    assert cfg.kind == uc.TRAINER and cfg.fmt == "json"
    # the dump's normalised defaults (accelerator_config {...}, debug [], pin memory off on the CPU) are no choice of
    # the user's: only the cosine schedule is named
    assert [line.split("=")[0] for line in uc._unhonoured(cfg, cfg.effective())] == ["lr_scheduler_type"]
    r = uc.reading(cfg, "cpu", _valid("classification"))
    assert r.options["batch_size"] == 16 and "task" not in r.options
    assert {"grad_accum=8", "grad_ckpt"} <= split_row(r.row)[0], r.row
    plan = plan_of(["smart_batch", "adamw_fused"], 8)
    assert plan is not None
    written = uc.write_back(cfg, plan, 16, "classification", 128, tmp_path)
    new = json.loads(written.path.read_text())
    assert written.path.name == "plan.args.json" and new["per_device_train_batch_size"] == 16
    assert new["train_sampling_strategy"] == "group_by_length" and new["optim"] == "adamw_torch_fused"
    trained = TrainingArguments(**{k: v for k, v in new.items() if not k.startswith("_")})
    assert trained.gradient_accumulation_steps == 1
    # the dump holds checkpointing under both names: both turned off, or the written file still checkpoints
    assert new["gradient_checkpointing"] is False and new["activation_checkpointing"] is False
    assert not trained.activation_checkpointing and not trained.gradient_checkpointing


def test_the_files_kind_without_a_task(tmp_path):
    """No --task: an SFT-only field says SFTConfig; the model and data keys both kinds of script read say what their
    local model is (a classifier's folder: TrainingArguments; a causal LM's: SFTConfig); none of them, the Trainer."""

    def kind(fields: dict, arch: str | None = None) -> str:
        if arch is not None:
            (tmp_path / "m").mkdir(exist_ok=True)
            (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": [arch]}))
            fields = {**fields, "model_name_or_path": str(tmp_path / "m")}
        path = tmp_path / "args.json"
        path.write_text(json.dumps({"per_device_train_batch_size": 2, **fields}))
        return uc.read(path).kind

    assert kind({}) == uc.TRAINER
    assert kind({"packing": True}) == uc.SFT
    assert kind({"dataset_name": "x.csv"}, "BertForSequenceClassification") == uc.TRAINER
    assert kind({"dataset_name": "x.csv"}, "LlamaForCausalLM") == uc.SFT
    assert kind({"dataset_name": "x.csv", "model_name_or_path": "org/hub-model"}) == uc.SFT


def test_only_what_the_file_can_say_is_searched():
    """Freezing, LoRA and ZeRO need code or files of their own: a config file cannot switch them."""
    sft = uc.expressible(uc.SFT, "causal-lm")
    assert {"packing", "padding_free", "grad_ckpt", "grad_accum", "bf16", "adamw_fused"} <= sft
    assert not {"freeze_embeddings", "lora", "zero2"} & sft
    assert "packing" not in uc.expressible(uc.TRAINER, "classification")


def test_a_dataset_load_dataset_reads_is_the_studys_dataset(tmp_path):
    """`dataset_name` as TRL reads it through `datasets.load_dataset`: a folder of parquet files (or a hub id, from the
    local cache offline) becomes the study's --dataset, its columns TRL's; a hub id neither cached nor reachable is one
    line (the bad-input cases below)."""
    from datasets import Dataset

    folder = tmp_path / "parquet"
    folder.mkdir()
    Dataset.from_dict({"prompt": ["a", "b"], "completion": ["c", "d"]}).to_parquet(str(folder / "train.parquet"))
    r = uc.reading(uc.read(_sft(tmp_path, dataset_name=str(folder))), "cpu", _valid("causal-lm"))
    assert r.options["dataset"] == str(folder) and "train_file" not in r.options
    assert (r.options["prompt_column"], r.options["response_column"]) == ("prompt", "completion")


@pytest.mark.parametrize(
    "write, says",
    [
        (lambda d: (d / "sft.yaml").write_text("per_device_train_batch_size: [1, 2"), "not a readable YAML file"),
        (lambda d: (d / "sft.yaml").write_text("- a list"), "expected the config's fields"),
        (lambda d: _sft(d, per_device_train_batch_size="four"), "per_device_train_batch_size must be a whole number"),
        (lambda d: _sft(d, packing="yes"), "packing must be true or false"),
        (lambda d: _sft(d, dataset_name="org/hub-dataset"), "cannot load dataset 'org/hub-dataset'"),
        (lambda d: _sft(d, truncation_mode="keep_middle"), "truncation_mode must be keep_start or keep_end"),
    ],
)
def test_bad_input_is_one_line(tmp_path, write, says):
    write(tmp_path)
    with pytest.raises(ConfigError, match=says):
        cfg = uc.read(tmp_path / "sft.yaml")
        uc.reading(cfg, "cpu", _valid("causal-lm"))


def test_plan_from_config_measures_yours_and_writes_the_file_back(tmp_path):
    """The CLI round: a study from the file (flags win over it), "yours" measured beside the baseline, the plan
    tested against it, OUT/plan.sft.yaml written and the change said; no file at all is one line and exit 2."""
    cfg = _sft(
        tmp_path,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        gradient_checkpointing=False,
        optim="adamw_torch",
        max_length=16,
    )
    out = tmp_path / "plan"
    argv = ["plan", "--from-config", str(cfg), "--model-preset", "llama-tiny", "--out", str(out), "--max-steps", "3"]
    argv += ["--warmup-steps", "1", "--eval-samples", "0", "--no-quality-check", "--no-ecosystem-default"]
    argv += ["--strategies", "baseline", "--max-trials", "1", "--retries", "0", "--trainer-rounds", "1"]
    argv += ["--trainer-steps", "3"]
    done = here.trainwise(*argv)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "plan.json").read_text())
    yours = result["yours"]
    assert split_row(yours["row"])[0] >= {"grad_accum=2", "dynamic_pad", "chunked_ce"}, yours["row"]
    assert any(ln["label"] == "yours" for ln in result["lines"])
    assert yours["written"] == str(out / "plan.sft.yaml") and Path(yours["written"]).is_file()
    assert "## Your config" in (out / "plan.md").read_text() and "your file:" in done.stderr
    # the trials cut and drop the pairs as `trl sft` will (TRL's default keep_start): an unpacked epoch holds the
    # pairs TRL keeps, and the note says how many it drops
    from trainwise.study.store import read_results
    from trainwise.training.data.prepared import read_prepared
    from trainwise.training.data.tasks import trl_cut, trl_examples
    from trainwise.training.models import ModelSource, load_tokenizer

    tokenizer = load_tokenizer(ModelSource("preset", "llama-tiny"), str(out / "tokenizer"))
    examples = trl_examples(read_prepared(str(out / "data"))[0], tokenizer, "prompt_response")
    kept = len(trl_cut(examples, 16, "keep_start"))
    assert 8 <= kept < len(examples), kept
    base = next(r for r in read_results(out) if r.baseline and r.status == "ok")
    assert base.epoch_time_s * base.samples_per_s == pytest.approx(kept)
    assert f"{len(examples) - kept} of them keep no response token and are dropped" in done.stderr
    # then both files trained by TRL's own SFTTrainer (one round: yours, then the plan's), the speed-up said from them
    trainer = yours["trainer"]
    assert yours["changes"] and trainer["rounds"] == 1 and "error" not in trainer, trainer
    for run in (trainer["yours"][0], trainer["plan"][0]):
        assert run["status"] == "ok" and run["epoch_s"] > 0 and run["final_loss"] > 0, run
    assert trainer["ratio"] == pytest.approx(trainer["yours"][0]["epoch_s"] / trainer["plan"][0]["epoch_s"])
    assert trainer["steps"] == 1 + 3 and len(trainer["yours"][0]["step_times_s"]) == 3  # the warm-up, then 3 timed
    low, high = trainer["interval"]
    assert low <= trainer["ratio"] <= high, trainer  # the interval is of the statistic stated
    assert any("SFTTrainer (your file and the plan's" in h for h in result["headline"]), result["headline"]
    assert "### In TRL" in (out / "plan.md").read_text() and "TRL's SFTTrainer, round 1 of 1: plan" in done.stderr
    bad = here.trainwise("plan", "--from-config", str(tmp_path / "nosuch.yaml"), "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "--from-config" in bad.stderr and "no such file" in bad.stderr
    assert len([ln for ln in bad.stderr.splitlines() if "error" in ln]) == 1, bad.stderr


def test_a_flag_named_on_the_line_wins_over_the_file_even_at_its_default(tmp_path):
    """`--max-length 128` (the option's default) over a file's `max_length: 32`: named on the line, it wins; a value
    only at its default (not named) leaves the file's."""
    from trainwise.api import from_config
    from trainwise.api.options import PlanOptions

    cfg = _sft(tmp_path, max_length=32)
    options = PlanOptions.of({"from_config": str(cfg), "max_length": 128, "out": str(tmp_path / "o")})
    assert from_config.prepare(options, {"from_config", "max_length", "out"})[0].max_length == 128
    assert from_config.prepare(options, {"from_config", "out"})[0].max_length == 32


def test_a_precision_the_device_only_emulates_is_said_before_yours_is_measured(tmp_path, monkeypatch):
    """TRL's SFTConfig trains bf16 by default, on a CPU without bf16 too (a notebook's "yours" ran emulated bf16 for
    over 12 minutes, unsaid): the plan says which precision, whose choice it was, and the field that turns it off."""
    import dataclasses

    import trainwise.study.prepare
    from trainwise.api import from_config
    from trainwise.api.options import PlanOptions

    monkeypatch.setattr(
        trainwise.study.prepare, "too_slow", lambda names, *_: {n: "emulated here" for n in names if n == "bf16"}
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # (the one-thread note of `trl sft` on a CPU: the test below)
    cfg = _sft(tmp_path)
    del_bf16 = yaml.safe_load(cfg.read_text())
    del_bf16.pop("bf16", None)
    cfg.write_text(yaml.safe_dump(del_bf16, sort_keys=False))
    options = PlanOptions.of({"from_config": str(cfg), "out": str(tmp_path / "o"), "device": "cpu"})
    notes = from_config.prepare(options, {"from_config", "out", "device"})[1].notes
    assert notes[0] == (
        "yours trains bf16 (the SFTConfig default), which this cpu only emulates (emulated here): it is measured as "
        "it would train here, and `bf16: false` trains fp32; the plan writes that where fp32 is faster"
    )
    # and, for an SFTConfig whose two files are not timed in TRL's own trainer (--trainer-rounds 0), what the trials
    # do not time: TRL's own step (BENCHMARKS §U1); by default both files are timed there, so nothing more is said
    assert len(notes) == 1, notes
    untimed = dataclasses.replace(options, trainer_rounds=0)
    trl = "not with SFTTrainer's own step"
    notes = from_config.prepare(untimed, {"from_config", "out", "device", "trainer_rounds"})[1].notes
    assert len(notes) == 2 and trl in notes[1], notes
    cfg.write_text(yaml.safe_dump({**del_bf16, "bf16": False}, sort_keys=False))
    fp32 = from_config.prepare(untimed, {"from_config", "out", "device", "trainer_rounds"})[1].notes
    assert len(fp32) == 1 and trl in fp32[0], "fp32: no precision to say"


def test_the_users_own_trainer_is_timed_as_trl_sft_builds_it(tmp_path):
    """`trainwise.training.own_trainer`: an SFTConfig file trained by TRL's SFTTrainer in a process of its own, its
    steps timed after the warm-up; its epoch is the examples TRL kept (cut at a max_length that leaves about half the
    pairs no completion token, so TRL drops them) over the file's batch (2 x accumulation 2); the study's data renamed
    to TRL's columns; a file TRL refuses is a row that names the field."""
    import dataclasses
    import math

    from trainwise.training.data.tasks import trl_cut, trl_examples
    from trainwise.training.models import ModelSource, load_tokenizer, train_tokenizer
    from trainwise.training.own_trainer import Data, TrainerRun, time_file

    pairs = [(f"Summarise item {i}: " + "word " * (1 + i % 12), f"item {i} in short") for i in range(24)]
    data = tmp_path / "pairs.csv"
    with data.open("w", newline="") as f:
        csv.writer(f).writerows([("question", "answer"), *pairs])
    train_tokenizer([p + c for p, c in pairs], "llama-tiny", tmp_path / "tok")
    tok = load_tokenizer(ModelSource("preset", "llama-tiny"), str(tmp_path / "tok"))
    examples = trl_examples([{"text": p, "target": c} for p, c in pairs], tok, "prompt_response")
    max_length = sorted(labels.count(-100) for _ids, labels in examples)[12]
    kept = len(trl_cut(examples, max_length, "keep_start"))
    assert 0 < kept < 24, kept
    cfg = tmp_path / "sft.yaml"
    two_by_two = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_length": max_length}
    cfg.write_text(yaml.safe_dump({**SLOW_SFT, **two_by_two}))
    data_ = Data(str(data), columns={"question": "prompt", "answer": "completion"})
    job = TrainerRun(str(cfg), "yours", str(tmp_path / "run"), 3, 1, data=data_, preset="llama-tiny")
    got = time_file(dataclasses.replace(job, tokenizer_dir=str(tmp_path / "tok")))
    assert got.status == "ok", got.message
    assert got.timed_steps == 2 and len(got.losses) == 3 and got.final_loss > 0, got
    assert got.epoch_time_s == pytest.approx(math.ceil(math.ceil(kept / 2) / 2) * got.step_time_median_s)
    cfg.write_text(yaml.safe_dump({**SLOW_SFT, "per_device_train_batch_size": "two"}))
    bad = time_file(dataclasses.replace(job, out=str(tmp_path / "bad")))
    assert bad.status == "error" and "per_device_train_batch_size" in bad.message, bad


def test_trl_sfts_one_thread_on_a_cpu_is_said(tmp_path, monkeypatch):
    """`trl sft` trains through `accelerate launch`, which on a CPU sets OMP_NUM_THREADS=1 where it is unset (§U1: 9.3 s
    a step against 5.4 s on two threads): the plan says so, with the command that trains as measured; not once the
    variable is set, nor for a TrainingArguments file (the user's own script)."""
    import torch

    from trainwise.api import from_config
    from trainwise.api.options import PlanOptions

    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    options = PlanOptions.of({"from_config": str(_sft(tmp_path)), "out": str(tmp_path / "o"), "device": "cpu"})
    notes = from_config.prepare(options, {"from_config", "out", "device"})[1].notes
    assert any("OMP_NUM_THREADS=4 trl sft --config FILE" in n for n in notes), notes
    # a caller's objects (plan(trainer=...)) train in the caller's process, not through `trl sft`
    notes = from_config.prepare(options, {"from_config", "out", "device"}, objects=True)[1].notes
    assert not any("OMP_NUM_THREADS" in n for n in notes), notes
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    notes = from_config.prepare(options, {"from_config", "out", "device"})[1].notes
    assert not any("OMP_NUM_THREADS" in n for n in notes), notes


def test_the_trainers_speed_up_has_an_interval_from_its_steps():
    """`step_interval`: each file's timed steps drawn again; the ratio is of epochs (steps an epoch times the median
    step), so a plan with half the steps an epoch at the same step time reads 2x, and steps that overlap read an
    interval over 1x; the same runs give the same interval."""
    import statistics

    from trainwise.api.from_config import step_interval

    def run(times: list[float], steps_an_epoch: int) -> dict:  # as own_trainer records a run
        med = statistics.median(times)
        return {"step_times_s": times, "s_per_step": med, "epoch_s": med * steps_an_epoch}

    even = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98]
    low, high = step_interval([run(even, 10)], [run(even, 5)])
    assert low < 2.0 < high and high / low < 1.3, (low, high)
    wide = [0.5, 1.5, 0.7, 1.3, 1.0, 0.6, 1.4, 0.9]
    low, high = step_interval([run(even, 10), run(even, 10)], [run(wide, 10)])
    assert low < 1.0 < high, (low, high)
    assert step_interval([run(even, 10)], [run(wide, 10)]) == step_interval([run(even, 10)], [run(wide, 10)])
    # two rounds that drift: the interval is of the ratio stated (the median over each file's runs), which it holds
    drift = [run(even, 10), run([1.0] * 4 + [3.0] * 4, 10)]
    stated = statistics.median(r["epoch_s"] for r in drift) / run(even, 10)["epoch_s"]  # as in_own_trainer states it
    low, high = step_interval(drift, [run(even, 10), run(even, 10)])
    assert low <= stated <= high, (low, stated, high)
    assert step_interval([{**run(even, 10), "step_times_s": None}], [run(even, 10)]) is None  # no steps kept


def test_the_trainers_steps_are_checked_at_the_edge():
    from trainwise.api.options import PlanOptions

    with pytest.raises(ConfigError, match="--trainer-steps must be >= 2, got 1"):
        PlanOptions.of({"trainer_steps": 1}).constraints()
