"""TrialResult: one trial's measurements, with units in the field names."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

STATUSES = ("ok", "unsupported", "oom", "error", "timeout", "crashed")


@dataclass
class TrialResult:
    strategy: str
    status: str  # one of STATUSES
    repeat: int = 0
    message: str = ""
    plan: dict = field(default_factory=dict)
    # timing over the timed (post-warm-up) optimizer steps
    step_time_s: float | None = None  # median
    step_time_p90_s: float | None = None
    data_wait_s: float | None = None  # median per step
    compute_s: float | None = None  # median forward+backward per step
    optimizer_s: float | None = None  # median clip+step+zero_grad per step
    warmup_s: float | None = None  # total time of the untimed warm-up steps
    timed_steps: int = 0
    samples_per_s: float | None = None  # samples / total timed seconds
    tokens_per_s: float | None = None  # non-pad tokens / total timed seconds
    padding_waste: float | None = None  # fraction of computed positions that are padding
    epoch_time_s: float | None = None  # projected: training samples / samples_per_s
    # memory
    peak_mem_bytes: int | None = None  # CUDA max allocated, or CPU peak RSS minus pre-model RSS
    mem_kind: str | None = None  # "cuda_allocated" | "cpu_rss_delta"
    peak_reserved_bytes: int | None = None  # CUDA max reserved
    peak_rss_bytes: int | None = None  # CPU: peak RSS of the whole trial process over its training steps
    state_bytes: int | None = None  # weights + grads + optimizer state, counted (not measured)
    rss_before_model_bytes: int | None = None
    # quality
    train_loss: float | None = None  # true mean loss over the last 5 optimizer steps
    final_loss: float | None = None  # loss of the last optimizer step
    metric_name: str | None = None
    metric: float | None = None
    metrics: dict = field(default_factory=dict)
    eval_s: float | None = None
    n_params: int | None = None
    n_trainable: int | None = None
    wall_s: float | None = None  # whole trial process, start to result
    env: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrialResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
