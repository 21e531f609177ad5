#!/usr/bin/env bash
# The CPU figures of BENCHMARKS.md (its section IDs, such as §P3, in the comments), in the order they were taken. Run
# from the repo root after `make venv`; nothing else should run on the machine meanwhile (timings on a shared box are
# noisy). Not here: §S7's one-run catalogue (its command is in its entry), the causal-LM entries (§L, §E1:
# benchmarks/causal_lm.sh, benchmarks/packing_speed.sh, benchmarks/chunked_ce.py, benchmarks/estimate_accuracy.py
# --task causal-lm), the fresh-clone suite timings (§T1: .ci/run in a fresh clone) and the GPU studies (§G, at the end).
set -euo pipefail
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TW=.venv/bin/trainwise
PY=.venv/bin/python
mkdir -p runs

# §T. the whole of the checks `make test` runs a part of (the `bench` marker, deselected by pyproject's addopts):
#    doctor training every registry row, the ZeRO contract over every stage and offload
$PY -m pytest -q -m bench --durations=0 | tee runs/bench-tests.txt

# §A1. make test wall time: see BENCHMARKS.md §A1 (two fresh clones, the commit before issue 12 and HEAD,
#    run back to back with `python -m pytest -q` on an otherwise idle machine)
#    and the loop's A/B: in each clone, alternately,
#    python -c "from trainwise.cli import app; app()" compare --strategies baseline,bf16 --repeat 2 --eval-samples 0

# §P3. bf16_pure vs bf16 vs baseline on the default study, 3 interleaved repeats
/usr/bin/time -f "wall %e s" $TW compare --strategies baseline,bf16,bf16_pure --repeat 3 \
  --out runs/bench-bf16-pure 2>&1 | tee runs/bench-bf16-pure.txt

# §S3. harness overhead: plain PyTorch loop vs trainwise baseline, alternating, paired ratios
.venv/bin/python benchmarks/overhead.py --rounds 7 | tee runs/bench-overhead.txt

# §S1. the default (demo) study, 3 interleaved repeats, medians
/usr/bin/time -f "wall %e s" $TW compare --repeat 3 --out runs/bench-demo-r3 2>&1 | tee runs/bench-demo-r3.txt

# §S9. seq2seq: t5-small (random init, real size) on stdlib-summarize, ROUGE/BLEU with generation
/usr/bin/time -f "wall %e s" $TW compare --task seq2seq --model-preset t5-small --max-steps 12 --warmup-steps 3 \
  --eval-samples 64 \
  --strategies baseline,bf16,grad_accum,grad_ckpt,adafactor,dynamic_pad,smart_batch,freeze_embeddings,freeze_encoder,all \
  --out runs/bench-t5-small 2>&1 | tee runs/bench-t5-small.txt

# §E3. estimate accuracy: 26 (model, plan, batch, length) cases, predicted vs the real loop's allocated peak,
#    with accelerate's and DeepSpeed's estimates beside it (the DeepSpeed column needs the optional
#    extra: .venv/bin/pip install --no-build-isolation 'deepspeed==0.19.8'; without it the column says n/a)
.venv/bin/python benchmarks/estimate_accuracy.py --json runs/bench-estimate.json | tee runs/bench-estimate.txt

# §B1. find-batch on the default model under a 3 GB limit: throughput per batch size, estimate skips, bisection
/usr/bin/time -f "wall %e s" $TW find-batch --candidates 8,16,32,64,128 --steps 4 --memory-limit 3GB \
  --out runs/bench-find-batch 2>&1 | tee runs/bench-find-batch.txt

# §X2. data parallel and ZeRO on CPU (issue 3): the default study's baseline as 1 process, then as 2 gloo
#    ranks (same global batch 16: 8 per rank) next to the ZeRO stages over the same 2 ranks
/usr/bin/time -f "wall %e s" $TW compare --strategies baseline --repeat 3 --eval-samples 0 \
  --out runs/bench-nproc1 2>&1 | tee runs/bench-nproc1.txt
/usr/bin/time -f "wall %e s" $TW compare --strategies baseline,zero1,zero2,zero3,zero2_offload,zero3_offload \
  --nproc 2 --repeat 3 --eval-samples 0 --out runs/bench-nproc2 2>&1 | tee runs/bench-nproc2.txt

# §S10. seed 003's table: ResNeXt on the built-in digits, DataLoader workers x precision x checkpointing x batch
/usr/bin/time -f "wall %e s" $TW compare --task image-classification --model-preset resnext-small \
  --strategies baseline,bf16,grad_ckpt,channels_last --num-workers 0,1,2,4,8 --batch-sizes 128,512 \
  --max-steps 8 --warmup-steps 3 --eval-samples 0 --repeat 3 --out runs/bench-seed003 2>&1 | tee runs/bench-seed003.txt

# §S8. the other new CPU strategies on the default study: attention kernels, torch.compile, layer freezing
/usr/bin/time -f "wall %e s" $TW compare --strategies baseline,sdpa,eager_attn,compile,freeze_layers,freeze_layers=5 \
  --out runs/bench-issue3-more 2>&1 | tee runs/bench-issue3-more.txt

# §Q4. trainwise train on the default model: early stopping and checkpoints
/usr/bin/time -f "wall %e s" $TW train --strategies smart_batch --epochs 1 --max-steps 60 --eval-every 10 \
  --save-every 10 --patience 2 --min-delta 0.5 --out runs/train-demo 2>&1 | tee runs/bench-train.txt

# §A2. tune: random search vs TPE on the same budget (12 trials x 100 steps), two seeds each
for seed in 0 1; do
  for search in random tpe; do
    /usr/bin/time -f "wall %e s" $TW tune --space benchmarks/tune_space_digits.yaml --search $search --trials 12 \
      --task image-classification --max-steps 100 --eval-every 25 --eval-samples 400 --seed $seed \
      --out runs/bench-tune-$search-$seed 2>&1 | tee runs/bench-tune-$search-$seed.txt
  done
done

# §Q3. tune: random vs TPE vs PBT on the same budget (8 trials / a population of 8, 100 steps each), two seeds
#     each; benchmarks/tune_compare.py prints the table (best accuracy, steps spent, best-so-far at a budget)
for seed in 0 1; do
  for search in random tpe pbt; do
    /usr/bin/time -f "wall %e s" $TW tune --space benchmarks/tune_space_digits.yaml --search $search --trials 8 \
      --task image-classification --max-steps 100 --eval-every 25 --eval-samples 400 --seed $seed \
      --out runs/bench-tune8-$search-$seed 2>&1 | tee runs/bench-tune8-$search-$seed.txt
  done
done
$PY benchmarks/tune_compare.py runs/bench-tune8-*-* | tee runs/bench-tune8.md

# §X1. train over ranks: one process, DDP and ZeRO-2 over 2 gloo ranks; ZeRO-2 killed at step 15 and resumed
A="--max-steps 20 --eval-every 10 --save-every 10"
/usr/bin/time -f "wall %e s" $TW train --strategies baseline $A --out runs/b13-one 2>&1 | tee runs/bench-train-ranks.txt
/usr/bin/time -f "wall %e s" $TW train --strategies baseline --nproc 2 $A --out runs/b13-ddp 2>&1 | tee -a runs/bench-train-ranks.txt
/usr/bin/time -f "wall %e s" $TW train --strategies zero2 --nproc 2 $A --out runs/b13-z2 2>&1 | tee -a runs/bench-train-ranks.txt
TRAINWISE_FAULT=train:kill@15 $TW train --strategies zero2 --nproc 2 $A --out runs/b13-z2k 2>&1 | tee -a runs/bench-train-ranks.txt || true
/usr/bin/time -f "wall %e s" $TW train --strategies zero2 --nproc 2 $A --out runs/b13-z2k --resume 2>&1 | tee -a runs/bench-train-ranks.txt

# §R1. reliability: bad inputs per verb (the table-driven tests), a study killed at random 20 times x 3 and
#     resumed (rows lost, re-runs, orphans), then how fast a flag error and an unreachable Hub are said
$PY benchmarks/reliability.py --kills 20 --seeds 3 --json runs/bench-reliability.json | tee runs/bench-reliability.txt
for v in "compare --lr nan" "estimate --batch-size 0" "find-batch --refine -3" "advise x --objective speed" \
  "export --strategies bf16 --lr nan" "train --epochs 0" "tune --space missing.yaml"; do
  for i in 1 2 3; do /usr/bin/time -f "$v: %e s" $TW $v >/dev/null 2>>runs/bench-fail-fast.txt || true; done
done
for i in 1 2 3; do
  env -u HF_HUB_OFFLINE /usr/bin/time -f "hub model: %e s" $TW compare --model org/not-cached-model \
    --out runs/hub-x 2>>runs/bench-fail-fast.txt || true
done
grep ": .* s$" runs/bench-fail-fast.txt

# §S5. noise and contention: the default study's baseline 5 times, quiet and beside one busy process
$PY benchmarks/noise.py --repeat 5 --busy 1 | tee runs/bench-noise.txt

# §E2. estimate vs compare on one memory basis (live tensors), 24 pairs on two CSVs from /var/lib/dpkg/status
$PY benchmarks/memory_basis.py --out runs/bench-memory | tee runs/bench-memory.txt

# §S1. MFU of the demo rows: the default study (its table has the MFU column and the probe's peaks)
$TW compare --out runs/demo-readme --force | tee runs/bench-mfu.txt

# §S6. P4: short-trial rankings vs one whole epoch (Kendall tau-b)
$PY benchmarks/ranking.py | tee runs/bench-ranking.txt

# §Q2. the demo study's quality phase (after `make demo`-style compare into runs/demo-readme)
$TW compare --out runs/demo-readme --quality-steps 120 --seeds 2 | tee runs/bench-quality-demo.txt

# §Q1. the quality phase on a CSV the project did not make (pkgs.csv from §E2's script), 3 seeds
/usr/bin/time -f "wall %e s" $TW compare --train-file runs/bench-memory/pkgs.csv --text-column summary \
  --target-column section --lr 2e-4 --max-length 64 --out runs/bench-quality-csv --quality-steps 120 --seeds 3 \
  2>&1 | tee runs/bench-quality-csv.txt
$TW advise runs/bench-quality-csv --max-quality-drop 2

# §C1. cost across machines: one CPU as two priced SKUs (1 and 2 threads), advise over both
OMP_NUM_THREADS=1 $TW compare --strategies baseline,bf16,smart_batch,all --price-per-hour 0.05 --out runs/bench-sku-1vcpu
$TW compare --strategies baseline,bf16,smart_batch,all --price-per-hour 0.10 --out runs/bench-sku-2vcpu
$TW advise runs/bench-sku-1vcpu runs/bench-sku-2vcpu --objective cost
$TW advise runs/bench-sku-1vcpu runs/bench-sku-2vcpu

# §P1, §S3, §S5, §S1. truth on any machine (issue 24): doctor, the overhead (in one process and fresh), a busy
#     process started mid-study (the contended baseline re-measured), and the demo's MFU column
$TW doctor --out runs/bench-doctor | tee runs/bench-doctor.txt
$PY benchmarks/overhead.py --rounds 5 | tee runs/bench-overhead.txt
$PY benchmarks/overhead.py --rounds 3 --fresh | tee -a runs/bench-overhead.txt
$PY benchmarks/contention.py --start 12 --seconds 40 --busy 2 --out runs/bench-contention | tee runs/bench-contention.txt

# §R2. what a new user tripped on (issue 27): a filling tmpfs under compare and train (root), the disk a
#     short t5-small train keeps, and the demo's report.md rerun from its own command
[ "$(id -u)" = 0 ] && bash benchmarks/full_disk.sh | tee runs/bench-full-disk.txt
$TW train --task seq2seq --max-steps 8 --out runs/bench-t5-disk | tee runs/bench-t5-disk.txt
eval ".venv/bin/$(sed -n '/^```sh$/{n;p}' runs/demo/report.md)" 2>&1 | grep -c '(stored)'

# §S4. one API (issue 25): trials forked from the zygote vs exec'd (wall, RSS, peaks, step time); the suite on a
#     fresh clone is BENCHMARKS.md §T1
bash benchmarks/zygote.sh 2 | tee runs/bench-zygote.txt

# §G. GPU: not run here (it needs an NVIDIA GPU): seed 001's table and the HF docs' single-GPU study with
#     --device cuda, each study under runs/gpu; `bash benchmarks/gpu.sh --device cpu` is its CPU dry run
#    bash benchmarks/gpu.sh
