"""What a child process hands back (`trainwise.run.events.Result`): a compare trial's measurements (TrialResult,
with units in the field names), a training run's (TrainResult) and a tune trial's (TuneTrialResult)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, fields

# "emulated": a default row whose precision this device only emulates, recorded from the linear-layer
# micro-benchmark and not trained (minutes per step on such a CPU); a row the user names is trained.
STATUSES = ("ok", "unsupported", "emulated", "oom", "error", "timeout", "crashed")


@dataclass
class TrialResult:
    strategy: str
    status: str  # one of STATUSES
    repeat: int = 0
    message: str = ""
    plan: dict = field(default_factory=dict)
    # timing over the timed (post-warm-up) optimizer steps
    step_time_s: float | None = None  # mean: timed seconds / timed steps (every time column derives from totals)
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_iqr_s: float | None = None  # interquartile range of the timed steps: their noise
    step_times_s: list | None = None  # each timed step's seconds, where the job keeps them (your own trainer's run)
    data_wait_s: float | None = None  # median per step
    compute_s: float | None = None  # median forward+backward per step
    optimizer_s: float | None = None  # median clip+step+zero_grad per step
    warmup_s: float | None = None  # total time of the untimed warm-up steps
    compile_s: float | None = None  # torch.compile rows: warm-up time beyond steady steps (the compiling)
    timed_steps: int = 0
    # of those, steps added after the evaluation to make the timed window long enough to judge the load on
    # the machine (trial._autorange): they count in the time, not in the loss or the quality
    added_steps: int = 0
    samples_per_s: float | None = None  # samples / timed seconds (one statistic per row: totals)
    tokens_per_s: float | None = None  # non-pad tokens / timed seconds
    padding_waste: float | None = None  # fraction of computed positions that are padding
    # causal-lm: fraction of the real (non-pad) tokens that carry loss (the response's, after the shift);
    # None for the other tasks
    loss_token_share: float | None = None
    epoch_time_s: float | None = None  # projected: training samples / samples_per_s
    # memory
    # peak of live tensor bytes (the allocator's peak, what `estimate` predicts): CUDA max_memory_allocated
    # over the training steps; CPU: one extra step on the largest window, profiled (trial.measure_step).
    # Stores from before 2026-11-24 hold "cpu_rss_delta" here: peak RSS minus the RSS before the model.
    peak_mem_bytes: int | None = None
    mem_kind: str | None = None  # "cuda_allocated" | "cpu_allocated" (| "cpu_rss_delta", older stores)
    peak_reserved_bytes: int | None = None  # CUDA max reserved
    peak_rss_bytes: int | None = None  # CPU: peak RSS of the whole trial process over its training steps
    state_bytes: int | None = None  # weights + grads + optimizer state, counted (not measured)
    rss_before_model_bytes: int | None = None
    # MFU (trainwise.training.measure.flops): counted FLOPs of an average timed step over the measured matmul peak
    flops_per_step: float | None = None
    peak_flops_per_s: float | None = None  # this device's linear layer run as the plan runs it, measured
    peak_mode: str | None = (
        None  # how: fp32, autocast-bf16, weights-bf16, ... (trainwise.training.measure.flops.linear_mode)
    )
    mfu: float | None = None  # flops_per_step / step_time_s / peak_flops_per_s; never > 1 (None, mfu_note says why)
    compute_dtype: str | None = None  # fp32 | bf16 | fp16: the dtype the plan's matmuls run in
    mfu_note: str = ""  # why FLOPs were not counted, when they were not
    # quality
    train_loss: float | None = None  # true mean loss over the last 5 optimizer steps
    final_loss: float | None = None  # loss of the last optimizer step
    losses: list | None = None  # the loss of every optimizer step of the study's (not of the steps autorange adds)
    metric_name: str | None = None
    metric: float | None = None
    metrics: dict = field(default_factory=dict)
    eval_s: float | None = None
    n_params: int | None = None
    n_trainable: int | None = None
    wall_s: float | None = None  # whole trial process, start to result
    env: dict = field(default_factory=dict)
    # data parallel / ZeRO: the combined row of `world_size` ranks (see combine_ranks)
    world_size: int = 1
    timed_s: float | None = None  # total timed seconds (the slowest rank's, when combined)
    rank_peak_mem_bytes: list | None = None  # peak_mem_bytes of each rank, in rank order
    trace: str | None = None  # --profile: the Chrome/Perfetto trace of the training steps (rank 0's)
    # contention: what other processes took while the timed steps ran (trainwise.training.measure.contention)
    other_cpu_share: float | None = None  # of all CPUs' time
    steal_share: float | None = None  # stolen by the hypervisor
    contended: bool | None = None  # either beyond its threshold: the timings are unreliable
    cpu_mhz: list | None = None  # the CPUs' mean clock at the start and the end of the timed steps
    discarded_runs: int = 0  # runs of this trial measured under load and run again (compare --retries)
    # the precision's verdict on this device when it is not native (strategies.base.Support.line), and a
    # linear layer's time in the row's precision over fp32, measured (trainwise.training.measure.device)
    support_note: str = ""
    precision_ratio: float | None = None

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrialResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def combine_ranks(results: list[TrialResult | None], expected_world: int) -> TrialResult:
    """One row from the per-rank results of a multi-process trial.

    A rank that failed makes the row fail with its message (a missing rank result, when no rank
    reported a failure, is `crashed`). Time is the slowest rank's step (the step is as slow as it), and MFU at
    it; throughput is all ranks' samples per step over that step; memory is the largest rank's peak, with every
    rank's peak kept in `rank_peak_mem_bytes` (their sum is the total across the machine).
    """
    present = [(i, r) for i, r in enumerate(results) if r is not None]
    failed = [(i, r) for i, r in present if r.status != "ok"]
    if failed:
        i, r = failed[0]
        return dataclasses.replace(r, message=f"rank {i}: {r.message}", world_size=expected_world)
    missing = [i for i, r in enumerate(results) if r is None]
    if missing or not present:
        first = present[0][1] if present else None
        return TrialResult(
            strategy=first.strategy if first else "",
            status="crashed",
            repeat=first.repeat if first else 0,
            message=f"rank {missing[0] if missing else 0} of {expected_world} ended without a result",
            plan=first.plan if first else {},
            world_size=expected_world,
        )
    ranks = [r for _, r in present]
    if any(r.world_size != expected_world for r in ranks):
        got = ranks[0].world_size
        return dataclasses.replace(
            ranks[0],
            status="error",
            message=f"asked for {expected_world} processes, the process group had {got}",
            world_size=got,
        )
    slowest = max(ranks, key=lambda r: r.step_time_s or 0.0)
    step = slowest.step_time_s or 0.0
    timed = max(r.timed_s or 0.0 for r in ranks)
    # per step: each rank's samples/s x its step (both from its totals, trainwise.training.measure.timing)
    samples = sum((r.samples_per_s or 0.0) * (r.step_time_s or 0.0) for r in ranks)
    real = [(r.tokens_per_s or 0.0) * (r.step_time_s or 0.0) for r in ranks]  # non-pad tokens each rank saw
    padded = [
        x / (1 - r.padding_waste) if r.padding_waste is not None and r.padding_waste < 1 else x
        for x, r in zip(real, ranks, strict=True)
    ]
    tokens = sum(real)
    n_train = (ranks[0].epoch_time_s or 0.0) * (ranks[0].samples_per_s or 0.0)
    peaks = [int(r.peak_mem_bytes or 0) for r in ranks]
    main = ranks[0]
    return dataclasses.replace(
        main,
        step_time_s=slowest.step_time_s,
        step_time_p90_s=slowest.step_time_p90_s,
        data_wait_s=slowest.data_wait_s,
        compute_s=slowest.compute_s,
        optimizer_s=slowest.optimizer_s,
        warmup_s=max(r.warmup_s or 0.0 for r in ranks),
        timed_s=timed,
        samples_per_s=samples / step if step else None,
        tokens_per_s=tokens / step if step else None,
        padding_waste=1 - tokens / sum(padded) if sum(padded) else main.padding_waste,
        epoch_time_s=n_train * step / samples if samples else None,
        mfu=utilisation(main.flops_per_step, step, main.peak_flops_per_s or 0.0)[0] if step else None,
        peak_mem_bytes=max(peaks),
        peak_reserved_bytes=max((r.peak_reserved_bytes or 0 for r in ranks), default=None) or None,
        peak_rss_bytes=max((r.peak_rss_bytes or 0 for r in ranks), default=None) or None,
        state_bytes=max(r.state_bytes or 0 for r in ranks),
        rank_peak_mem_bytes=peaks,
        world_size=expected_world,
    )


@dataclass
class TrainResult:
    """A training run (`trainwise train`): what train_result.json holds, less its derived `compute_saved`."""

    steps: int
    planned_steps: int
    stopped_early: bool
    final_loss: float
    best_step: int
    best_value: float | None
    monitor: str
    evals: list[dict]
    resumed_from: str | None
    wall_s: float
    out: str
    disk: dict[str, int] = field(default_factory=dict)  # bytes under --out: checkpoints, best, final, total

    @property
    def compute_saved(self) -> float:
        return 1 - self.steps / self.planned_steps

    def to_dict(self) -> dict:
        """train_result.json's content."""
        return {**asdict(self), "compute_saved": self.compute_saved}

    @classmethod
    def from_dict(cls, d: dict) -> TrainResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


TUNE_STATES = ("complete", "pruned", "timeout", "fail")


@dataclass(frozen=True)
class TuneTrialResult:
    """One trial of `trainwise tune` (random / tpe): its state, its best monitored value, the optimizer
    steps it ran and, when it failed, why."""

    state: str  # one of TUNE_STATES
    value: float | None = None
    steps: int = 0
    error: str = ""

    def __post_init__(self) -> None:
        assert self.state in TUNE_STATES, self.state

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TuneTrialResult:
        return cls(**d)


@dataclass(frozen=True)
class StudyRow:
    """One row of a study's table (results.json's `rows`): a cell's trials aggregated (trainwise.study.aggregate),
    with units in the field names as in TrialResult. Medians over the cell's ok repeats keep the type a median
    gives (an int, or a float between two). `to_dict()` is results.json's entry, key for key in its order;
    `from_dict()` reads it back, and the rows of older studies (missing keys take their defaults)."""

    strategy: str  # the table's name: the row, plus the swept values (`bf16 @bs16`)
    random_init: bool = False  # a text size preset: random weights, so its quality says little
    row: str | None = None  # the row's text (`bf16+grad_ckpt`); None in studies from before it was stored
    baseline: bool = False
    batch_size: int | None = None  # the cell's (None in studies from before cells)
    workers: int | None = None
    status: str = "?"  # one of results.STATUSES (the last trial's when none was ok)
    message: str = ""
    repeats: int = 0  # ok trials
    mem_kind: str | None = None
    compute_dtype: str | None = None
    peak_mode: str | None = None
    mfu_note: str = ""
    support_note: str = ""
    precision_ratio: float | None = None
    metric_name: str | None = None
    plan: dict = field(default_factory=dict)  # knob values (TrialPlan.to_dict)
    env: dict = field(default_factory=dict)  # trainwise.core.env.environment: free-form
    world_size: int = 1
    rank_peak_mem_bytes: list | None = None
    trace: str | None = None
    # medians over the ok repeats, each on its own (study.NUMERIC)
    padding_waste: float | None = None
    loss_token_share: float | None = None  # causal-lm only (None: the key is absent from results.json)
    peak_mem_bytes: float | None = None
    peak_reserved_bytes: float | None = None
    peak_rss_bytes: float | None = None
    state_bytes: float | None = None
    rss_before_model_bytes: float | None = None
    flops_per_step: float | None = None
    peak_flops_per_s: float | None = None
    train_loss: float | None = None
    final_loss: float | None = None
    metric: float | None = None
    eval_s: float | None = None
    wall_s: float | None = None
    # the timing of one trial, the median one by samples/s (study.TIMING)
    step_time_s: float | None = None
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_iqr_s: float | None = None
    timed_steps: int | None = None
    added_steps: int | None = None
    data_wait_s: float | None = None
    compute_s: float | None = None
    optimizer_s: float | None = None
    warmup_s: float | None = None
    compile_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    epoch_time_s: float | None = None
    timed_s: float | None = None
    other_cpu_share: float | None = None
    steal_share: float | None = None
    contended: bool | None = None
    cpu_mhz: list | None = None
    mfu: float | None = None
    timing_repeat: int | None = None  # which repeat the timing columns are
    discarded_runs: int = 0
    # present only when a trial of the cell was ok (None: the key is absent from results.json)
    metrics: dict | None = None
    step_time_s_all: list | None = None
    losses: list | None = None  # the first ok trial's loss at every optimizer step (report.html draws them)
    # relative to the baseline, and the noise floor that judges it
    rel_time: float | None = None  # baseline samples/s / this row's: > 1 is slower
    rel_mem: float | None = None
    noise_floor: float | None = None
    noise_source: str = ""
    within_noise: bool | None = None
    # not flagged `contended`, yet the others' share of the CPUs while it or the baseline was timed could
    # slow a step by as much as it differs from the baseline (aggregate.load_bound): its time % is not judged
    uncertain: bool = False
    # a study on nodes of several device kinds (trainwise.run.cluster): the kind this row was measured on, and compared
    # within (its baseline is that kind's); None on one kind
    device_kind: str | None = None
    # a priced study (report.format.add_cost): both keys are in results.json exactly when cost_note is not None
    cost_per_epoch: float | None = None  # USD for one projected epoch
    cost_note: str | None = None  # the price it was computed at
    # what advise adds from beside the table (never in results.json unless set): the quality phase's verdict,
    # and the steps and held-out rows the speed trials' quality rests on
    quality_verdict: str | None = None
    trial_steps: int | None = None
    eval_samples: int | None = None
    # keys this version does not know (a newer trainwise's results.json): kept, written back last
    extra: dict = field(default_factory=dict)

    @property
    def row_text(self) -> str:
        """The row's text, or its table name in studies from before the text was stored."""
        return self.row or self.strategy

    @property
    def priced(self) -> bool:
        return self.cost_note is not None

    def to_dict(self) -> dict:
        """results.json's entry for this row: today's keys in today's order (the optional ones only when set)."""
        out: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or (f.name in _ABSENT_WHEN_NONE and value is None):
                continue
            if f.name in _ABSENT_WHEN_UNSET and not value:  # added since: a study's rows without them stay as written
                continue
            if f.name in ("cost_per_epoch", "cost_note") and not self.priced:
                continue
            out[f.name] = value
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: dict) -> StudyRow:
        """A results.json entry, of this version or an older one (absent keys take their defaults; unknown
        keys go to `extra`). The entry must have a 'strategy' (study.store.read_results refuses one without)."""
        known = _ROW_FIELDS
        extra = {k: v for k, v in d.items() if k not in known}
        if "cost_per_epoch" in d and d.get("cost_note") is None:  # priced, without a note: keep it priced
            d = {**d, "cost_note": ""}
        return cls(**{k: v for k, v in d.items() if k in known}, extra=extra)


# keys results.json holds only when they have a value (see StudyRow.to_dict)
_ABSENT_WHEN_NONE = frozenset(
    {
        "metrics",
        "step_time_s_all",
        "losses",
        "quality_verdict",
        "trial_steps",
        "eval_samples",
        "loss_token_share",
        "device_kind",
    }
)
_ABSENT_WHEN_UNSET = frozenset({"added_steps", "uncertain"})  # 0 / False: the key is left out
_ROW_FIELDS = frozenset(f.name for f in fields(StudyRow)) - {"extra"}


def utilisation(flops_per_step: float | None, step_s: float, peak_flops_per_s: float) -> tuple[float | None, str]:
    """MFU of a step (counted FLOPs / step time / peak) and a note. Above 100% the peak is wrong
    (measured on another kernel than the model runs, or under load), never the step: no MFU then."""
    if not flops_per_step or step_s <= 0 or peak_flops_per_s <= 0:
        return None, ""
    mfu = flops_per_step / step_s / peak_flops_per_s
    if mfu > 1.0:
        return None, (
            f"no MFU: the step ran {flops_per_step / step_s / 1e9:.3g} GFLOP/s, above the probe's peak "
            f"{peak_flops_per_s / 1e9:.3g} GFLOP/s, so the peak probe is wrong for this row (a report would help)"
        )
    return mfu, ""
