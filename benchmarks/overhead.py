"""Harness overhead: trainwise's baseline step time vs a plain PyTorch loop, side by side.

Same model (bundled all-MiniLM-L6-v2 by default), same data (stdlib-topic), same batch, padding,
optimizer (AdamW, clip 1.0, linear decay) and number of steps. The plain loop takes the model's own
loss and has no measurement machinery. The two alternate, `--rounds` times each, in this process
(default) or each in a fresh process (`--fresh`, as trials run; adds ~25 s of start-up a sample).
Reported: both medians and the median of the per-round ratios (paired, so drift cancels). Usage:

    .venv/bin/python benchmarks/overhead.py [--rounds 7] [--fresh] [--steps 20] [--warmup 4] [--model-preset NAME]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def plain_loop(spec, steps: int, warmup: int) -> float:
    """Median step time of a textbook loop over the same batches the harness would see."""
    from transformers import get_linear_schedule_with_warmup

    from trainwise.strategies.batching.samplers import make_batches
    from trainwise.training.data.prepared import read_prepared
    from trainwise.training.data.tasks import Collator, EncodedDataset, encode
    from trainwise.training.models import ModelSource, build_model, load_tokenizer

    s = spec.settings
    source = ModelSource(s.model_kind, s.model_ref)
    tok = load_tokenizer(source, s.tokenizer_dir)
    train_rows, _, labels = read_prepared(s.data_dir)
    enc = encode(train_rows, tok, s.task, s.max_length, s.max_target_length, {x: i for i, x in enumerate(labels)})
    sampler = make_batches("random", enc.lengths(), s.batch_size, s.seed)
    loader = torch.utils.data.DataLoader(
        EncodedDataset(enc),
        batch_sampler=sampler,
        collate_fn=Collator(s.task, tok.pad_token_id, "max_length", s.max_length, s.max_target_length),
    )
    model = build_model(source, s.task, len(labels), s.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    sched = get_linear_schedule_with_warmup(opt, 0, steps)
    times = []
    it = iter(loader)
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        loss = model(**batch.inputs, labels=batch.labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:])


def child(kind: str, spec_path: str) -> None:
    import json

    from trainwise.spec.config import TrialSpec
    from trainwise.training.trial import run_trial

    with open(spec_path) as f:
        spec = TrialSpec.from_dict(json.load(f))
    s = spec.settings
    step = plain_loop(spec, spec.steps, s.warmup_steps) if kind == "plain" else run_trial(spec).step_time_s
    print(f"STEP {step}")


def measure(kind: str, spec_path: str) -> float:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, __file__, "--child", kind, spec_path], capture_output=True, text=True)
    lines = [x for x in out.stdout.splitlines() if x.startswith("STEP ")]
    if out.returncode or not lines:
        raise SystemExit(f"{kind} run failed: {out.stderr.strip().splitlines()[-1:]}")
    return float(lines[-1].split()[1])


def main() -> None:
    import json
    import os
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--fresh", action="store_true", help="each measurement in a fresh process")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--model-preset", default=None)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=128)
    args = ap.parse_args()

    from trainwise.core.env import environment
    from trainwise.spec.config import StudyConfig
    from trainwise.study.prepare import prepare_study

    out = tempfile.mkdtemp(prefix="trainwise-overhead-")
    cfg = StudyConfig(
        out=out,
        strategies=["baseline"],
        model_preset=args.model_preset,
        max_steps=args.steps,
        warmup_steps=args.warmup,
        batch_size=args.batch_size,
        max_length=args.max_length,
        eval_samples=0,
        device="cpu",
    )
    spec = prepare_study(cfg).specs[0]
    spec_path = os.path.join(out, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec.to_dict(), f)
    from trainwise.training.trial import run_trial

    def once(kind: str) -> float:
        if args.fresh:
            return measure(kind, spec_path)
        if kind == "plain":
            return plain_loop(spec, args.steps, args.warmup)
        return run_trial(spec).step_time_s

    plain, harness = [], []
    for r in range(args.rounds):
        plain.append(once("plain"))
        harness.append(once("trainwise"))
        print(f"round {r + 1}: plain {plain[-1]:.4f} s/step  trainwise {harness[-1]:.4f} s/step", flush=True)
    p, h = statistics.median(plain), statistics.median(harness)
    env = environment("cpu")
    print(
        f"model {spec.settings.model_label}, batch {args.batch_size}, max_length {args.max_length}, "
        f"{args.steps} steps ({args.warmup} untimed), {args.rounds} rounds, "
        f"{'fresh process each' if args.fresh else 'alternating in one process'}; "
        f"{env['device_name']}, torch {env['torch']}, commit {env['commit']}"
    )
    ratio = statistics.median(t / q for t, q in zip(harness, plain, strict=True))
    print(
        f"median step: plain {p:.4f} s, trainwise {h:.4f} s ({100 * (h / p - 1):+.1f}%); "
        f"median of paired ratios {100 * (ratio - 1):+.1f}%"
    )


if __name__ == "__main__":
    main()
