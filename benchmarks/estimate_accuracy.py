"""How close is `trainwise estimate` to the measured peak? And accelerate's / DeepSpeed's estimates?

For each case (model, plan, batch, length) this builds the estimate (meta device + the cached family
probe), then runs the real trial (`run_trial`, 2 optimizer steps, padding to max length) in this process and
reads the peak of live tensors it reports: what `compare` shows in its memory column (on CPU: the state
held at a measured step plus that step's peak from torch.profiler's memory events; on CUDA
max_memory_allocated over the trial). An outer profiler around the trial is not possible: the trial
profiles its own step, and nested profilers crash torch's trace export.

Side by side, for the same cases:
- accelerate: `accelerate estimate-memory`'s training column, i.e. max(estimate_training_usage(...))
  for the model's fp32 size (float32 plans) or its mixed-precision formula (bf16/fp16 plans);
- DeepSpeed: estimate_zero2_model_states_mem_needs(params, 1 GPU, no offload): model states only.

Each case runs in a fresh process (`--case N`), like a trial: one process's earlier cases cannot
leak into the next one's measurement.

Usage: python benchmarks/estimate_accuracy.py [--quick] [--task causal-lm] [--plans chunked_ce,...] [--no-bf16]
       [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from trainwise.api.estimate import run_estimate  # noqa: E402
from trainwise.estimating.data import EstimateConfig  # noqa: E402
from trainwise.estimating.peak import estimate
from trainwise.spec.config import StudyConfig  # noqa: E402
from trainwise.study.prepare import prepare_study  # noqa: E402
from trainwise.training.models import ModelSource  # noqa: E402
from trainwise.training.trial import run_trial  # noqa: E402

# (model, task, row spec, batch, max_length, max_target_length)
CASES = [
    ("bert-base", "classification", "baseline", 16, 128, 48),
    ("bert-base", "classification", "bf16", 16, 128, 48),
    ("bert-base", "classification", "grad_ckpt", 16, 128, 48),
    ("bert-base", "classification", "adafactor", 16, 128, 48),
    ("bert-base", "classification", "grad_accum", 32, 128, 48),
    ("bert-base", "classification", "freeze_encoder", 16, 128, 48),
    ("bert-base", "classification", "baseline", 8, 256, 48),
    ("bert-base", "classification", "baseline", 4, 64, 48),
    ("bert-base", "classification", "bf16+grad_ckpt", 32, 128, 48),
    ("all-MiniLM-L6-v2", "classification", "baseline", 32, 128, 48),
    ("all-MiniLM-L6-v2", "classification", "bf16", 32, 256, 48),
    ("all-MiniLM-L6-v2", "classification", "grad_ckpt", 64, 128, 48),
    ("all-MiniLM-L6-v2", "classification", "adafactor", 16, 64, 48),
    ("t5-small", "seq2seq", "baseline", 16, 128, 48),
    ("t5-small", "seq2seq", "bf16", 16, 128, 48),
    ("t5-small", "seq2seq", "grad_ckpt", 16, 128, 48),
    ("t5-small", "seq2seq", "freeze_encoder", 16, 128, 48),
    ("t5-small", "seq2seq", "grad_accum", 32, 128, 48),
    ("t5-small", "seq2seq", "baseline", 8, 256, 96),
    ("bart-base", "seq2seq", "baseline", 8, 128, 48),
    ("bart-base", "seq2seq", "bf16", 8, 128, 48),
    ("bart-base", "seq2seq", "grad_ckpt", 16, 128, 48),
    ("bart-base", "seq2seq", "adafactor", 8, 64, 32),
    ("t5-base", "seq2seq", "baseline", 8, 128, 48),
    ("bert-base", "classification", "lora", 16, 128, 48),
    ("t5-small", "seq2seq", "lora", 16, 128, 48),
    # causal-lm (issue 26): stdlib-instruct prompt/response rows padded to the length; "smollm2" is the real
    # SmolLM2-135M-Instruct (dequantized GGUF), the presets are random-init family configs
    ("smollm2-135m", "causal-lm", "baseline", 4, 256, 48),
    ("smollm2-135m", "causal-lm", "bf16", 4, 256, 48),
    ("smollm2-135m", "causal-lm", "grad_ckpt", 4, 256, 48),
    ("smollm2-135m", "causal-lm", "lora", 4, 256, 48),
    ("smollm2-135m", "causal-lm", "packing", 4, 256, 48),
    ("smollm2-135m", "causal-lm", "chunked_ce", 8, 256, 48),
    ("smollm2-135m", "causal-lm", "grad_accum", 8, 256, 48),
    ("gpt2-124m", "causal-lm", "baseline", 4, 256, 48),
    ("gpt2-124m", "causal-lm", "lora+chunked_ce", 8, 256, 48),
    ("smollm2", "causal-lm", "baseline", 4, 128, 48),
    ("smollm2", "causal-lm", "bf16+grad_ckpt+lora+packing+chunked_ce", 8, 256, 48),
    ("qwen2-tiny", "causal-lm", "baseline", 16, 256, 48),
    ("smollm2-135m", "causal-lm", "qlora", 4, 256, 48),
]
REAL_MODELS = ("all-MiniLM-L6-v2", "smollm2")  # not size presets
QUICK = [0, 2, 9, 13, 15, 19]


def accelerate_estimate(n_params: int, precision: str) -> int:
    from accelerate.commands.estimate import estimate_training_usage

    dtype = "float32" if precision == "fp32" else "float16"
    return int(max(estimate_training_usage(4 * n_params, dtype).values()))


def deepspeed_estimate(n_params: int) -> int | None:
    try:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    except Exception:  # optional: not installed, or no accelerator it can load
        return None
    _cpu, gpu = estimate_zero2_model_states_mem_needs(n_params, num_gpus_per_node=1, num_nodes=1, cpu_offload=False)
    return int(gpu)


def measure(case, device: str, work: str) -> dict:
    model, task, row, batch, length, tlen = case
    preset = model if model not in REAL_MODELS else None
    cfg = StudyConfig(
        out=os.path.join(work, f"{model}-{task}"),
        strategies=[row],
        task=task,
        model=None if preset else model,
        model_preset=preset,
        batch_size=batch,
        max_length=length,
        max_target_length=tlen,
        max_steps=2,
        warmup_steps=1,
        eval_samples=0,
        max_train_samples=max(256, 2 * batch),
        device=device,
    )
    study = prepare_study(cfg)
    spec = study.specs[0]
    s = spec.settings
    plan = spec.plan
    source = ModelSource(s.model_kind, s.model_ref)
    t0 = time.perf_counter()
    if task == "causal-lm":  # as `trainwise estimate --dataset stdlib-instruct` reads it: the responses' lengths
        ecfg = EstimateConfig(
            strategies=(row,), task=task, batch_size=batch, max_length=length, dataset="stdlib-instruct", device="cpu"
        )
        est = run_estimate(None if preset else model, preset, ecfg, lambda _: None).estimates[0][1]
    else:
        est = estimate(source, task, s.num_labels or 2, plan, batch, length, tlen, s.device)
    est_s = time.perf_counter() - t0
    result = run_trial(spec)
    assert result.status == "ok", result.message
    measured = result.peak_mem_bytes  # what compare shows: live tensors at the step + the step's peak
    return {
        "model": model,
        "task": task,
        "plan": row,
        "batch": batch,
        "length": length,
        "target_length": tlen if task == "seq2seq" else None,
        "measured": measured,
        "trainwise": est.peak_bytes,
        "trainwise_phase": est.phase,
        "trainwise_parts": est.parts,
        "estimate_s": est_s,
        "accelerate": accelerate_estimate(result.n_params, plan.value("precision")),
        "deepspeed": deepspeed_estimate(result.n_params),
        "n_params": result.n_params,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 cases instead of all")
    ap.add_argument("--task", default=None, help="only this task's cases (e.g. causal-lm)")
    ap.add_argument("--plans", default=None, help="only cases whose plan contains one of these, comma-separated")
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 plans (a CPU that emulates bf16)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default=None, help="write every case here")
    ap.add_argument("--case", type=int, default=None, help=argparse.SUPPRESS)  # internal: one case, JSON out
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case is not None:
        print("RESULT " + json.dumps(measure(CASES[args.case], args.device, args.work)), flush=True)
        return 0
    indices = QUICK if args.quick else list(range(len(CASES)))
    if args.task:
        indices = [i for i in indices if CASES[i][1] == args.task]
    if args.plans:  # e.g. a CPU whose bf16 is emulated (AVX2 only) takes hours over the bf16 cases
        indices = [i for i in indices if any(p in CASES[i][2] for p in args.plans.split(","))]
    if args.no_bf16:
        indices = [i for i in indices if "bf16" not in CASES[i][2]]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for i, index in enumerate(indices, 1):
            cmd = [sys.executable, __file__, "--case", str(index), "--device", args.device, "--work", work]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
            r = json.loads(line[len("RESULT ") :])
            rows.append(r)
            print(
                f"[{i}/{len(indices)}] {r['model']} {r['plan']} b={r['batch']} L={r['length']}: "
                f"measured {r['measured'] / 2**20:.0f} MiB, trainwise {r['trainwise'] / 2**20:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
    mib = 2**20

    def err(x, m):
        return None if x is None else (x - m) / m

    head = ["model", "plan", "batch", "len", "measured MiB", "trainwise MiB (err)", "accelerate MiB (err)"]
    print("| " + " | ".join([*head, "DeepSpeed MiB (err)"]) + " |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r["measured"]
        cells = []
        for k in ("trainwise", "accelerate", "deepspeed"):
            v = r[k]
            cells.append("n/a" if v is None else f"{v / mib:,.0f} ({100 * err(v, m):+.0f}%)")
        length = f"{r['length']}/{r['target_length']}" if r["target_length"] else str(r["length"])
        print(f"| {r['model']} | {r['plan']} | {r['batch']} | {length} | {m / mib:,.0f} | " + " | ".join(cells) + " |")
    for k in ("trainwise", "accelerate", "deepspeed"):
        errs = [abs(err(r[k], r["measured"])) for r in rows if r[k] is not None]
        if errs:
            print(
                f"{k}: median |error| {100 * statistics.median(errs):.1f}%, worst {100 * max(errs):.1f}% "
                f"over {len(errs)} cases"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
