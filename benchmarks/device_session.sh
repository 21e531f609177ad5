#!/usr/bin/env bash
# One lent GPU session in one command: `trainwise doctor --device cuda`, then benchmarks/gpu.sh's studies
# (doctor already ran, so gpu.sh skips its own), on a machine whose python3 already holds a CUDA build of
# torch and transformers (the device tool's image) and that cannot reach a package registry.
#   bash benchmarks/device_session.sh OUTDIR [SECONDS]
#   STEPS="wheels doctor plan" bash benchmarks/device_session.sh OUTDIR [SECONDS]   # choose the steps
# Steps (STEPS, default "wheels doctor pytest studies"), in this order:
# - wheels: the wheels carried in .whl/ (bitsandbytes, liger-kernel, cut-cross-entropy: the device cannot reach
#   a registry) unpacked into one directory put on PYTHONPATH, so python3 and every trial import them.
# - doctor, pytest (the gpu-marked tests), studies (gpu.sh's seed 001 and HF docs' studies).
# - plan: `trainwise plan` on the bert-base preset (PLAN_PRESET) over the GPU's single rows, with its
#   quality check (issue 36 on a GPU); OUTDIR/plan.log, plan.md and plan.json.
# - reference: benchmarks/reference_loop.py, the hand-written loop (fp32, bf16 + fused AdamW, bf16 + compile) on
#   the smollm2-135m shape, REF_BATCH x REF_LENGTH (16 x 512) packed tokens; OUTDIR/reference.json (issue 53).
# - lmplan: `trainwise plan` on the same shape and prompt/response pairs it never saw (LM_DATA, default
#   .bench/man.csv: `benchmarks/man_pairs.py .bench/man.csv` makes it here, and `carry` takes .bench there), the
#   causal-lm default rows (compile added on a GPU), the ecosystem default measured beside them; OUTDIR/lmplan.md
#   and lmplan.json. Run `STEPS="wheels reference lmplan"` for issue 53's comparison in one call.
# DOCTOR_LIMIT (seconds, default SECONDS) stops a hung doctor early enough for the steps after it.
# - .venv: when this checkout has none, .venv/bin/{python,trainwise} run python3 with this checkout on its
#   path, no download. The versions that differ from requirements.lock are
#   printed first (doctor.json records them too).
# - OUTDIR gets doctor.log, pytest_gpu.log (the tests marked gpu), seed001.log, hf_docs.log, versions.txt and results.tar.gz (every study's
#   results.json, report.md, report.csv and doctor.json), even when SECONDS (default 540) cut the studies.
# A failed doctor does not stop the studies here: its checks are in doctor.json, and a GPU session is too
# scarce to end at the first failing strategy.
set -uo pipefail
OUTDIR=${1:?usage: bash benchmarks/device_session.sh OUTDIR [SECONDS]}
LIMIT=${2:-540}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
RESULTS=/tmp/trainwise-gpu
DEVICE=${DEVICE:-cuda} # DEVICE=cpu: the same steps as a dry run (gpu.sh --device cpu)
START=$(date +%s)
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

# python3 there is itself a venv's (/opt/torch/.venv): a venv made from it would see the base interpreter's
# packages, not its torch. So .venv/bin holds wrappers that run python3 itself with this checkout on its path
# (PYTHONPATH reaches every trial's child process too).
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
STEPS=" ${STEPS:-wheels doctor pytest studies} "
step() { [[ $STEPS == *" $1 "* ]]; }
if step wheels && compgen -G ".whl/*.whl" >/dev/null; then
  WHEELS=/tmp/trainwise-wheels
  python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' "$WHEELS" .whl/*.whl &&
    export PYTHONPATH=$PYTHONPATH:$WHEELS && echo "=== device_session: wheels on the path: $(ls .whl | tr '\n' ' ')"
fi
if [ ! -x .venv/bin/trainwise ]; then
  PY3=$(command -v python3) || exit 1
  mkdir -p .venv/bin
  printf '#!/bin/sh\nexec %s "$@"\n' "$PY3" >.venv/bin/python
  printf '#!/bin/sh\nexec %s -c "import sys; from trainwise.cli import main; sys.exit(main())" "$@"\n' "$PY3" \
    >.venv/bin/trainwise
  chmod +x .venv/bin/python .venv/bin/trainwise
fi
{
  nvidia-smi -L 2>&1
  .venv/bin/python - <<'EOF'
import importlib.metadata as md, re
pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", open("requirements.lock").read(), re.M))
core = "torch transformers accelerate tokenizers typer rich matplotlib psutil rouge-score sacrebleu safetensors numpy pyyaml peft trl datasets deepspeed bitsandbytes".split()
for name, want in sorted((n, v) for n, v in pins.items() if n.lower() in core):
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        have = "missing"
    if have.split("+")[0] != want:
        print(f"{name}: {have} here, {want} in requirements.lock")
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
EOF
} 2>&1 | tee "$OUTDIR/versions.txt"

collect() {
  cp "$RESULTS"/*.log "$OUTDIR"/ 2>/dev/null
  (cd "$RESULTS" && find . \( -name results.json -o -name report.md -o -name report.csv -o -name doctor.json \
    -o -name settings.json \) -print0 | tar -czf "$OUTDIR/results.tar.gz" --null -T -)
  echo "=== device_session: $(($(date +%s) - START)) s; results in $OUTDIR"
}
trap collect EXIT
mkdir -p "$RESULTS"
if step doctor; then
echo "=== device_session: trainwise doctor --device $DEVICE"
# a doctor that hangs is stopped with SIGABRT: with PYTHONFAULTHANDLER=1 it prints every thread's stack first
# (one did hang, before its first trial, on 2026-11-26: BENCHMARKS.md §G1)
PYTHONFAULTHANDLER=1 timeout -s ABRT -k 10 "${DOCTOR_LIMIT:-$LIMIT}" .venv/bin/trainwise doctor --device "$DEVICE" --out "$RESULTS/doctor" 2>&1 | tee "$RESULTS/doctor.log"
echo "=== device_session: doctor exit ${PIPESTATUS[0]}"
fi
if step pytest && [ "$DEVICE" = cuda ]; then # the tests marked gpu (skipped in CI): compare's and train's steps agree on CUDA
  echo "=== device_session: pytest -m gpu"
  timeout 150 .venv/bin/python -m pytest -q -m gpu -p no:cacheprovider tests/strategies/test_contract.py 2>&1 |
    tee "$RESULTS/pytest_gpu.log"
  echo "=== device_session: pytest exit ${PIPESTATUS[0]}"
fi
if step plan; then
  left=$((LIMIT - ($(date +%s) - START)))
  [ "$left" -gt 60 ] || exit 1
  echo "=== device_session: trainwise plan (${PLAN_PRESET:-bert-base}), ${left} s left"
  # the GPU's single rows: the precisions, its kernels and optimizers, the data strategies; search 6 rows at most
  timeout -s INT -k 20 "$left" .venv/bin/trainwise plan --device "$DEVICE" --model-preset "${PLAN_PRESET:-bert-base}" \
    --out "$RESULTS/plan" --batch-size 32 --max-length 128 --max-steps "${PLAN_STEPS:-40}" --repeat 1 \
    --strategies "${PLAN_ROWS:-fp16,bf16,tf32,adamw_fused,adafactor,grad_ckpt,dynamic_pad,smart_batch,freeze_embeddings}" \
    --max-trials 6 --quality-steps "${PLAN_QUALITY_STEPS:-120}" --seeds 2 2>&1 | tee "$RESULTS/plan.log"
  echo "=== device_session: plan exit ${PIPESTATUS[0]}"
  cp "$RESULTS"/plan/plan.md "$RESULTS"/plan/plan.json "$OUTDIR"/ 2>/dev/null
fi
if step reference; then
  echo "=== device_session: the hand-written reference loop"
  timeout -k 10 "${REF_LIMIT:-240}" .venv/bin/python benchmarks/reference_loop.py --device "$DEVICE" \
    --batch "${REF_BATCH:-16}" --length "${REF_LENGTH:-512}" --steps "${REF_STEPS:-20}" --warmup "${REF_WARMUP:-5}" \
    --json "$OUTDIR/reference.json" 2>&1 | tee "$RESULTS/reference.log"
  echo "=== device_session: reference exit ${PIPESTATUS[0]}"
fi
if step lmplan; then
  left=$((LIMIT - ($(date +%s) - START)))
  [ "$left" -gt 60 ] || exit 1
  echo "=== device_session: trainwise plan, causal-lm ($(wc -l <"${LM_DATA:-.bench/man.csv}") lines of pairs), ${left} s left"
  timeout -s INT -k 20 "$left" .venv/bin/trainwise plan --task causal-lm --model-preset smollm2-135m \
    --train-file "${LM_DATA:-.bench/man.csv}" --prompt-column description --response-column summary \
    --device "$DEVICE" --out "$RESULTS/lmplan" --batch-size "${REF_BATCH:-16}" --max-length "${REF_LENGTH:-512}" \
    --max-steps "${LM_STEPS:-30}" --warmup-steps "${LM_WARMUP:-5}" --eval-samples 0 --max-trials "${LM_TRIALS:-8}" \
    --no-quality-check 2>&1 | tee "$RESULTS/lmplan.log"
  echo "=== device_session: lmplan exit ${PIPESTATUS[0]}"
  cp "$RESULTS"/lmplan/plan.md "$OUTDIR"/lmplan.md 2>/dev/null
  cp "$RESULTS"/lmplan/plan.json "$OUTDIR"/lmplan.json 2>/dev/null
fi
if step studies; then
  left=$((LIMIT - ($(date +%s) - START)))
  [ "$left" -gt 30 ] || exit 1
  DOCTOR=skip timeout "$left" bash benchmarks/gpu.sh --device "$DEVICE" --out "$RESULTS"
fi
