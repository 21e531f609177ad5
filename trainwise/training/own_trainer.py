"""The user's own trainer, timed (issue 59, BENCHMARKS §U1): an SFTConfig file trained by TRL's SFTTrainer, built as
`trl sft --config FILE` builds it (trl/scripts/sft.py: the file's SFTConfig and ModelConfig, the model by name, its
quantization and PEFT configs), for a few optimizer steps in a process of its own, each step timed from the end of the
one before (the batch's loading, TRL's loss and its logged entropy and token accuracy, the optimizer, the logging).

A study's trials time trainwise's loop on the examples TRL builds; TRL's step does more (§U1: 1.17x measured where the
trials said 1.85x). `trainwise plan --from-config` runs this job on the user's file and on the file it writes back,
interleaved, and states that speed-up. What it overrides in the file: the steps (`max_steps`), the seed, a loss logged
every step (the same for both files), where it writes (nothing kept: no checkpoint, no saved model, no tracker) and,
where the study's options named others, the model and the data (`TrainerRun.model`, `.data`)."""

from __future__ import annotations

import contextlib
import io
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwise.core.results import TrialResult
from trainwise.run.events import Emit, Step
from trainwise.run.faults import is_oom
from trainwise.run.launcher import Exit, Place, run


@dataclass(frozen=True)
class Data:
    """The data the study trains, for TRL: a file (`train_file`) or what `datasets.load_dataset` reads (`dataset`,
    `name:config`), its columns renamed to TRL's where the study's options named others."""

    train_file: str | None = None
    dataset: str | None = None
    split: str = "train"
    columns: dict[str, str] = field(default_factory=dict)  # the study's column -> TRL's (prompt, completion, ...)
    max_rows: int | None = None  # the study's --max-train-samples: its first rows only


@dataclass(frozen=True)
class TrainerRun:
    """One timed run of the file at `path`: `steps` optimizer steps of which the first `warmup` are not timed.
    `model`: a path or hub id in place of the file's model_name_or_path (None: the file's); `preset`: a trainwise size
    preset built with random weights instead (its tokenizer in `tokenizer_dir`)."""

    path: str
    label: str
    out: str
    steps: int
    warmup: int
    seed: int = 0
    device: str = "cpu"  # the study's: where the trainer runs (the file's use_cpu decides within it)
    data: Data = field(default_factory=Data)
    model: str | None = None
    preset: str | None = None
    tokenizer_dir: str | None = None

    def place(self) -> Place:
        return Place(Path(self.out) / "job.json", Path(self.out) / "stderr.log", None, self.device)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, blob: dict) -> TrainerRun:
        return cls(**{**blob, "data": Data(**blob["data"])})

    def run(self, emit: Emit) -> TrialResult:
        """In the child: the trainer built and trained; any failure is a row (`error`, or `oom`)."""
        try:
            return _train(self, emit)
        except BaseException as exc:  # a failure is a row, never a lost plan
            if isinstance(exc, KeyboardInterrupt):
                raise
            traceback.print_exc(file=sys.stderr)
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            status = "oom" if is_oom(exc) else "error"
            return TrialResult(strategy=self.label, status=status, message=f"{type(exc).__name__}: {text}"[:500])

    def ended(self, results: list[TrialResult | None], end: Exit) -> TrialResult:
        if results and results[0] is not None:
            results[0].wall_s = end.wall_s
            return results[0]
        if end.timed_out:
            message = f"no result within {end.timeout_s:g}s; killed"
            return TrialResult(strategy=self.label, status="timeout", message=message, wall_s=end.wall_s)
        message = f"the trainer's process exited with code {end.code} and no result: {end.tail[:300]}"
        return TrialResult(strategy=self.label, status="crashed", message=message, wall_s=end.wall_s)


def time_file(job: TrainerRun, timeout_s: float | None = None) -> TrialResult:
    """`job` in a fresh process: its steady steps' times, the epoch they project, its losses; or why it failed."""
    Path(job.out).mkdir(parents=True, exist_ok=True)
    return run(job, timeout_s=timeout_s)


def _dataset(data: Data) -> Any:
    from datasets import load_dataset  # heavy: datasets

    if data.train_file is not None:
        suffix = Path(data.train_file).suffix.lstrip(".")
        found = load_dataset("json" if suffix in ("json", "jsonl") else suffix, data_files=data.train_file)["train"]
    else:
        assert data.dataset is not None
        name, _, config = data.dataset.partition(":")
        found = load_dataset(name, name=config or None)[data.split]
    renames = {k: v for k, v in data.columns.items() if k != v and k in found.column_names}
    found = found.rename_columns(renames) if renames else found
    return found.select(range(min(data.max_rows, len(found)))) if data.max_rows is not None else found


def _train(job: TrainerRun, emit: Emit) -> TrialResult:
    import torch  # heavy: torch
    from transformers import TrainerCallback  # heavy: transformers
    from trl import SFTTrainer, get_peft_config, get_quantization_config  # heavy: TRL
    from trl.scripts.sft import make_parser  # heavy: TRL (its `trl sft` parser: the file as the CLI reads it)

    overrides = ["--config", job.path, "--max_steps", str(job.steps), "--seed", str(job.seed)]
    overrides += ["--output_dir", str(Path(job.out) / "trl"), "--save_strategy", "no", "--report_to", "none"]
    overrides += ["--eval_strategy", "no", "--push_to_hub", "false", "--logging_steps", "1"]
    if job.model is not None:
        overrides += ["--model_name_or_path", job.model]
    said = io.StringIO()
    try:  # the file as `trl sft` parses it: a field it refuses is argparse's message, one line
        with contextlib.redirect_stderr(said):
            parsed = make_parser().parse_args_and_config(overrides, fail_with_unknown_args=False)
    except SystemExit:
        lines = [ln for ln in said.getvalue().splitlines() if ln.strip()]
        raise ValueError(f"{job.path}: {lines[-1] if lines else 'refused by TRL'}") from None
    _script, args, model_args, _mixture = parsed
    dataset = _dataset(job.data)
    cuda = torch.cuda.is_available() and not args.use_cpu
    ends: list[float] = []
    logged = [math.nan]

    class Clock(TrainerCallback):  # each optimizer step from the end of the one before: all a step costs
        def on_train_begin(self, *_a: Any, **_k: Any) -> None:
            ends.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            ends.append(time.perf_counter())
            emit(Step(state.global_step, job.steps, logged[-1], ends[-1] - ends[-2]))

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs") or {}
            if "loss" in logs:
                logged.append(float(logs["loss"]))

    if job.preset is not None:  # a trainwise size preset (a test's tiny model): built here, as trainwise builds it
        from trainwise.training.models import ModelSource, build_model, load_tokenizer  # heavy: transformers

        source = ModelSource("preset", job.preset)
        model: Any = build_model(source, "causal-lm", 0, job.seed)
        tokenizer = load_tokenizer(source, job.tokenizer_dir)
    else:  # as trl sft: the model by name, with the file's dtype, attention, quantization and PEFT
        kwargs = {"revision": model_args.model_revision, "trust_remote_code": args.trust_remote_code}
        kwargs |= {"attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype}
        args.model_init_kwargs = {**kwargs, **(args.model_init_kwargs or {})}
        model, tokenizer = model_args.model_name_or_path, None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        quantization_config=None if job.preset else get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
        callbacks=[Clock()],
    )
    trainer.train()
    steps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    timed = steps[job.warmup :]
    if not timed:
        raise RuntimeError(f"{len(steps)} steps trained, none timed after {job.warmup} warm-up steps")
    batches = len(trainer.get_train_dataloader())  # of the examples TRL built (packed, cut, dropped), as it batches
    step_s = statistics.median(timed)
    epoch_s = math.ceil(batches / args.gradient_accumulation_steps) * step_s
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    q1, _, q3 = statistics.quantiles(timed, n=4) if len(timed) > 1 else (step_s, step_s, step_s)
    return TrialResult(
        strategy=job.label,
        status="ok",
        step_time_s=sum(timed) / len(timed),
        step_time_median_s=step_s,
        step_time_iqr_s=q3 - q1,
        step_times_s=timed,
        warmup_s=sum(steps[: job.warmup]),
        timed_steps=len(timed),
        samples_per_s=len(dataset) / epoch_s,  # the data's examples (before TRL packs or drops them) per second
        epoch_time_s=epoch_s,
        peak_mem_bytes=torch.cuda.max_memory_allocated() if cuda else None,
        mem_kind="cuda_allocated" if cuda else None,
        final_loss=losses[-1] if losses else None,
        losses=losses,
        timed_s=sum(timed),
    )
