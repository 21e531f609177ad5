#!/usr/bin/env bash
# Trials forked from the zygote vs exec'd from scratch (TRAINWISE_FORK=0), side by side, alternating:
# the study's wall time, and what each row measured (tensor peak, RSS, before-model RSS, step time).
# Usage: bash benchmarks/zygote.sh [ROUNDS]   (PY=<venv python>; writes /tmp/zygote-bench)
set -euo pipefail
PY=${PY:-$(pwd)/.venv/bin/python}
ROUNDS=${1:-2}
OUT=/tmp/zygote-bench
rm -rf "$OUT" && mkdir -p "$OUT"
cd /tmp
uptime
for round in $(seq 1 "$ROUNDS"); do
  for fork in 1 0; do
    start=$(date +%s.%N)
    TRAINWISE_FORK=$fork HF_HUB_OFFLINE=1 "$PY" -m trainwise.cli compare --model-preset bert-tiny \
      --strategies baseline,bf16,grad_ckpt --max-steps 6 --warmup-steps 1 --no-remeasure --retries 0 \
      --out "$OUT/r$round-f$fork" >/dev/null 2>&1
    echo "round $round fork=$fork wall $(echo "$(date +%s.%N) - $start" | bc) s"
  done
done
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
for fork in ("1", "0"):
    rows = [r for d in sorted(out.glob(f"r*-f{fork}")) for r in json.loads((d / "results.json").read_text())["rows"]]
    for key in ("peak_mem_bytes", "peak_rss_bytes", "rss_before_model_bytes", "step_time_s", "wall_s"):
        values = [r[key] for r in rows if r.get(key) is not None]
        print(f"fork={fork} {key:24} median {statistics.median(values):.4g}  range {min(values):.4g}-{max(values):.4g}")
    print(f"fork={fork} env.process {sorted({r['env'].get('process') for r in rows})}")
PYEOF
