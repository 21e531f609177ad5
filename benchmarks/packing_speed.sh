#!/usr/bin/env bash
# BENCHMARKS.md §L1: packing's supervised tokens/s on data with a realistic length spread, measured
# long enough to read time (§L7's 3-step trials could not). SmolLM2-135M-Instruct (the default model) on
# prompt/response pairs from the machine's package database (made by benchmarks/causal_lm.sh's (b)), batch 8 of
# up to 256 tokens: baseline (padding to 256), dynamic_pad (padding to each batch's longest) and packing (full rows
# of whole examples); 12 steps, the first 2 untimed, the baseline run again last for the noise floor.
# Run from the repo root after `make venv`, on an otherwise idle machine. Usage: bash benchmarks/packing_speed.sh [out-dir]
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${1:-runs}
mkdir -p "$OUT"
[ -f "$OUT/dpkg-pairs.csv" ] || sed -n '/^# (b)/,/^EOF$/p' benchmarks/causal_lm.sh | sed '1,2d;$d' \
  | .venv/bin/python - "$OUT/dpkg-pairs.csv"
grep -o -m1 'avx512_bf16\|amx_bf16' /proc/cpuinfo || echo "no native bf16 (AVX2 only?)"
uptime
/usr/bin/time -f "wall %e s" .venv/bin/trainwise compare --task causal-lm --train-file "$OUT/dpkg-pairs.csv" \
  --prompt-column question --response-column answer --strategies baseline,dynamic_pad,packing \
  --batch-size 8 --accum-steps 1 --max-length 256 --max-steps 12 --warmup-steps 2 --eval-samples 0 \
  --out "$OUT/bench-packing-speed" 2>&1 | tee "$OUT/bench-packing-speed.txt"
uptime
