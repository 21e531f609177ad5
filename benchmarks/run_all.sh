#!/usr/bin/env bash
# Every figure in BENCHMARKS.md, in the order they were taken. Run from the repo root after
# `make venv`; nothing else should run on the machine meanwhile (timings on a shared box are noisy).
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TW=.venv/bin/trainwise
mkdir -p runs

# 1. harness overhead: plain PyTorch loop vs trainwise baseline, alternating, paired ratios
.venv/bin/python benchmarks/overhead.py --rounds 7 | tee runs/bench-overhead.txt

# 2. the default (demo) study, 3 interleaved repeats, medians
/usr/bin/time -f "wall %e s" $TW compare --repeat 3 --out runs/bench-demo-r3 2>&1 | tee runs/bench-demo-r3.txt

# 3. seq2seq: t5-small (random init, real size) on stdlib-summarize, ROUGE/BLEU with generation
/usr/bin/time -f "wall %e s" $TW compare --task seq2seq --model-preset t5-small --max-steps 12 --warmup-steps 3 \
  --eval-samples 64 \
  --strategies baseline,bf16,grad_accum,grad_ckpt,adafactor,dynamic_pad,smart_batch,freeze_embeddings,freeze_encoder,all \
  --out runs/bench-t5-small 2>&1 | tee runs/bench-t5-small.txt

# 6. estimate accuracy: 26 (model, plan, batch, length) cases, predicted vs the real loop's allocated peak,
#    with accelerate's and DeepSpeed's estimates beside it (the DeepSpeed column needs the optional
#    extra: .venv/bin/pip install --no-build-isolation 'deepspeed==0.19.8'; without it the column says n/a)
.venv/bin/python benchmarks/estimate_accuracy.py --json runs/bench-estimate.json | tee runs/bench-estimate.txt

# 7. find-batch on the default model under a 3 GB limit: throughput per batch size, estimate skips, bisection
/usr/bin/time -f "wall %e s" $TW find-batch --candidates 8,16,32,64,128 --steps 4 --memory-limit 3GB \
  --out runs/bench-find-batch 2>&1 | tee runs/bench-find-batch.txt
