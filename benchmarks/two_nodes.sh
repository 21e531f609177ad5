#!/usr/bin/env bash
# Issue 39's torchrun figure: `trainwise train` over two node agents on this host (static rendezvous, gloo,
# ZeRO-2, one rank each, one shared --out), killed at a step and resumed on both nodes, against the same two
# ranks on one machine (--nproc 2) never interrupted. Prints each run's wall time and losses.
#   bash benchmarks/two_nodes.sh OUT [KILL_AT]
set -euo pipefail
out=${1:?OUT}; kill_at=${2:-7}
py=${PY:-.venv/bin/python}
rm -rf "$out"; mkdir -p "$out"
common=(--strategies zero2 --max-length 64 --epochs 2 --max-steps 24 --eval-every 8 --save-every 4
        --eval-samples 64 --batch-size 16 --device cpu)
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
nodes() {  # PHASE OUT_DIR [extra...]: both node agents at once (logs OUT/nodeR.PHASE.log); their exit codes
  local phase=$1 dir=$2; shift 2; local p; p=$(port)
  local start=$(date +%s.%N)
  for r in 0 1; do
    "$py" -m trainwise.cli train "${common[@]}" --nnodes 2 --nproc-per-node 1 --node-rank $r \
      --master-addr 127.0.0.1 --master-port "$p" --out "$dir" "$@" > "$out/node$r.$phase.log" 2>&1 &
  done
  local codes=""; for j in $(jobs -p); do wait "$j" && codes+="0 " || codes+="$? "; done
  echo "  exit codes: $codes wall $(echo "$(date +%s.%N) - $start" | bc) s"
}
echo "one machine, --nproc 2:"
start=$(date +%s.%N)
"$py" -m trainwise.cli train "${common[@]}" --nproc 2 --out "$out/whole" > "$out/whole.log" 2>&1
echo "  wall $(echo "$(date +%s.%N) - $start" | bc) s"
echo "two nodes, killed at step $kill_at:"
TRAINWISE_FAULT="train:kill@$kill_at" nodes killed "$out/cut"
for r in 0 1; do echo "  node $r: $(grep 'trainwise: error' "$out/node$r.killed.log" | cut -c1-200)"; done
echo "two nodes, --resume:"
nodes resumed "$out/cut" --resume
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
w, r = (json.loads((out / d / "train_result.json").read_text()) for d in ("whole", "cut"))
print(f"resumed from {r['resumed_from']}; steps {r['steps']} / {w['steps']}")
print(f"final loss: two nodes, resumed {r['final_loss']:.6f}; one machine {w['final_loss']:.6f}; "
      f"difference {abs(r['final_loss'] - w['final_loss']):.2e}")
for a, b in zip(r["evals"], w["evals"]):
    print(f"  step {a['step']}: eval_loss {a.get('eval_loss'):.6f} vs {b.get('eval_loss'):.6f}; "
          f"train_loss {a['train_loss']:.6f} vs {b['train_loss']:.6f}")
PY
