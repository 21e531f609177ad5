#!/usr/bin/env bash
# A generating task's trials with the text metrics (rouge-score, sacrebleu) imported once by the zygote vs by
# every trial (the zygote's preload emptied for the command), side by side, alternating: the study's wall time
# and each trial's wall time. Usage: bash benchmarks/metrics_preload.sh [ROUNDS]   (writes /tmp/metrics-preload)
set -euo pipefail
PY=${PY:-$(pwd)/.venv/bin/python}
ROUNDS=${1:-2}
OUT=/tmp/metrics-preload
rm -rf "$OUT" && mkdir -p "$OUT"
uptime
for round in $(seq 1 "$ROUNDS"); do
  for preload in 1 0; do
    start=$(date +%s.%N)
    PRELOAD=$preload HF_HUB_OFFLINE=1 "$PY" - compare --task seq2seq --model-preset t5-tiny \
      --strategies baseline,grad_ckpt,adafactor,dynamic_pad --max-steps 4 --warmup-steps 1 --no-remeasure \
      --retries 0 --out "$OUT/r$round-p$preload" >/dev/null 2>&1 <<'PYEOF'
import os, sys
import trainwise.launcher as launcher
if os.environ["PRELOAD"] == "0":
    launcher.imports_for = lambda task: ()  # as before: every trial imports the metrics itself
from trainwise.cli import main
sys.exit(main(sys.argv[1:]))
PYEOF
    echo "round $round preload=$preload wall $(echo "$(date +%s.%N) - $start" | bc) s"
  done
done
"$PY" - "$OUT" <<'PYEOF'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
for preload in ("1", "0"):
    rows = [r for d in sorted(out.glob(f"r*-p{preload}")) for r in json.loads((d / "results.json").read_text())["rows"]]
    walls = [r["wall_s"] for r in rows if r.get("wall_s") is not None]
    print(f"preload={preload} trial wall_s median {statistics.median(walls):.2f}  range {min(walls):.2f}-{max(walls):.2f}"
          f"  ({len(walls)} trials)")
PYEOF
