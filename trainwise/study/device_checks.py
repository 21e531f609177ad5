"""`trainwise doctor`'s parts: what works on this device, proved by running it (the verb is `api/doctor.py`).

For every strategy in the registry, a 2-step trial of a tiny preset through the real loop (its own
process, as compare runs it): ok / emulated / inert (it ran, and its precision is emulated or does
nothing here) / unsupported (why) / failed (the error). Beside them the device's facts (name, compute
capability, memory, CPU flags), the measured peaks and precision ratios of its linear layers, and the
versions of the libraries the strategies use. The first command a GPU user runs, the one a bug report
quotes; written as a table and as doctor.json.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from trainwise import strategies
from trainwise.core.config import IMAGE_TASK
from trainwise.core.errors import RunFailed
from trainwise.core.results import TrialResult
from trainwise.spec.config import StudyConfig
from trainwise.training.measure import device as dev
from trainwise.training.measure import flops

VERDICTS = ("ok", "emulated", "inert", "unsupported", "failed")
LIBRARIES = ("torch", "transformers", "accelerate", "deepspeed", "bitsandbytes", "peft", "flash-attn", "triton")


@dataclass
class Check:
    strategy: str
    task: str  # the tiny preset's task it ran on
    verdict: str  # one of VERDICTS
    detail: str  # the reason, the error, or what a step took
    step_time_s: float | None = None


@dataclass
class DoctorReport:
    device: dict  # trainwise.training.measure.device.DeviceFacts.to_dict()
    environment: dict  # versions and the commit (trainwise.core.env), plus LIBRARIES' versions
    peaks_flops_per_s: dict[str, float]  # linear-layer mode -> measured FLOP/s
    precision_ratios: dict[str, float]  # precision -> a linear layer's time over fp32's
    checks: list[Check] = field(default_factory=list)
    wall_s: float = 0.0
    path: str = ""  # where doctor.json was written

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def check_failed(self) -> None:
        """RunFailed (exit 1) when a strategy this device supports failed."""
        failed = [c.strategy for c in self.checks if c.verdict == "failed"]
        if failed:
            raise RunFailed(f"{len(failed)} strategies failed on this device: {', '.join(failed)}")


PRESETS = {"classification": "bert-tiny", IMAGE_TASK: "resnext-tiny", "causal-lm": "llama-tiny"}  # by task


def rows_for(task: str) -> list[str]:
    """A row for every registry strategy that applies to `task` (the baseline first); a strategy that runs only
    beside another is checked with the first of them (cce as bf16+cce: `strategy_of` reads its name back)."""
    order = list(strategies.REGISTRY)
    rows = []
    for name, s in strategies.REGISTRY.items():
        if task in s.tasks:
            rows.append(f"{sorted(s.with_one_of, key=order.index)[0]}+{name}" if s.with_one_of else name)
    return rows


def strategy_of(row: str) -> str:
    """The strategy a doctor row checks: its last part (bf16+cce checks cce)."""
    return row.split("+")[-1]


def doctor_config(out: Path, device: str, task: str, rows: list[str]) -> StudyConfig:
    return StudyConfig(
        out=str(out / task),
        strategies=rows,
        task=task,
        model_preset=PRESETS[task],
        max_train_samples=64,
        batch_size=8,
        accum_steps=2,
        max_length=32,
        max_steps=2,
        warmup_steps=1,
        eval_samples=0,
        remeasure=False,
        retries=0,
        fit_to_device=False,  # every row is trained, emulated or not: that is what is being checked
        device=device,
        trial_timeout=300.0,
        force=True,
    )


def verdict(task: str, r: TrialResult) -> Check:
    name = strategy_of(r.strategy)
    if r.status == "unsupported":
        return Check(name, task, "unsupported", r.message)
    if r.status != "ok":
        return Check(name, task, "failed", f"{r.status}: {r.message}")
    note = r.support_note
    verdict = "emulated" if " emulated " in note else "inert" if " inert " in note else "ok"
    detail = note or f"{r.step_time_s:.3f} s/step"
    return Check(name, task, verdict, detail, r.step_time_s)


def measure_device(device: str) -> tuple[dict[str, float], dict[str, float]]:
    modes = ["fp32", "autocast-bf16", "weights-bf16"] + (["autocast-fp16"] if device == "cuda" else [])
    peaks = {m: flops.matmul_peak(device, m) for m in modes}
    precisions = ["bf16", "bf16_pure"] + (["fp16"] if device == "cuda" else [])
    return peaks, {p: dev.precision_ratio(device, p) for p in precisions}
