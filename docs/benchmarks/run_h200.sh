#!/usr/bin/env bash
# Benchmarks on nvidia-h200-x2 (2 x H200), one call of the device tool per phase:
#   bash docs/benchmarks/run_h200.sh PHASE        (the tool sets $OUT; files come back from it)
# Each configuration runs `python -m training.bench` under torchrun with its own time limit;
# no configuration starts once the phase's budget (BUDGET s) is nearly spent. JSONs go to
# $WORK/json and are re-packed into $OUT/results-PHASE.tgz after every run, so a call cut
# short still brings back what finished. The last lines printed are the table.
set -u
PHASE=${1:?phase}
OUT=${OUT:-/tmp/out}
WORK=/tmp/bench
mkdir -p "$OUT" "$WORK/json"
LOG=$OUT/log-$PHASE.txt
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=8
START=$(date +%s)
BUDGET=${BUDGET:-560}
PY=python3
SEVEN="--shape llama2-7b --seq-len 4096 --bench-steps 10 --bench-warmup 3"

elapsed() { echo $(( $(date +%s) - START )); }
pack() { tar czf "$OUT/results-$PHASE.tgz" -C "$WORK" json 2>/dev/null; }

bench() {  # bench NAME LIMIT_S NPROC FLAGS...
  local name=$1 limit=$2 nproc=$3; shift 3
  local now; now=$(elapsed)
  if (( now + 45 > BUDGET )); then echo "SKIP $name: budget ($now s used)" | tee -a "$LOG"; return; fi
  (( limit > BUDGET - now )) && limit=$(( BUDGET - now ))
  echo "=== $name: $nproc GPU, limit ${limit}s: $*" | tee -a "$LOG"
  timeout -k 15 "$limit" $PY -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
    -m training.bench --tag "$name" --out "$WORK/json" "$@" >>"$LOG" 2>&1
  echo "rc=$? $name at $(elapsed) s" | tee -a "$LOG"
  grep -h "tokens/s/GPU\|Error\|error" "$LOG" | tail -2
  pack
}

phase1() {
  { nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv
    nvidia-smi topo -m
    $PY -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(), transformers.__version__, torch.cuda.device_count())'
    env | grep -E '^(NCCL|TORCH|NVSHMEM)' ; } 2>&1 | tee -a "$LOG"
  timeout 150 $PY docs/benchmarks/h200_calibrate.py "$WORK/json/calibrate.json" >>"$LOG" 2>&1
  echo "calibrate rc=$? at $(elapsed) s" | tee -a "$LOG"
  timeout 90 $PY -m torch.distributed.run --standalone --nproc-per-node 2 \
    docs/benchmarks/nccl_bench.py "$WORK/json/nccl.json" >>"$LOG" 2>&1
  echo "nccl rc=$? at $(elapsed) s" | tee -a "$LOG"
  pack
  # A: the package as it was: full AC, eager, plain loss, host sync every step
  bench 7b-b3-full-eager-plain-sync 150 2 $SEVEN --batch-size 3 --activation-checkpointing full \
    --no-compile --loss plain --sync-every-step
  # B: + fused loss, no host sync
  bench 7b-b3-full-eager 150 2 $SEVEN --batch-size 3 --activation-checkpointing full --no-compile
  # C: + compile per block
  bench 7b-b3-full-compile 200 2 $SEVEN --batch-size 3 --activation-checkpointing full --compile
  # D: no AC
  bench 7b-b3-none-compile 200 2 $SEVEN --batch-size 3 --activation-checkpointing none --compile
  # E: + cuDNN attention
  bench 7b-b3-none-compile-cudnn 200 2 $SEVEN --batch-size 3 --activation-checkpointing none \
    --compile --sdpa-backend cudnn
  # F: batch 4
  bench 7b-b4-none-compile-cudnn 200 2 $SEVEN --batch-size 4 --activation-checkpointing none \
    --compile --sdpa-backend cudnn
}

"phase$PHASE"
pack
echo "--- phase $PHASE done at $(elapsed) s"
$PY docs/benchmarks/table.py "$WORK/json"
$PY - "$WORK/json" <<'PYEOF'
import json, sys, pathlib
for name in ("calibrate.json", "nccl.json"):
    p = pathlib.Path(sys.argv[1]) / name
    if p.exists():
        r = json.loads(p.read_text())
        print(name, json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items() if not isinstance(v, dict)}))
        for k, v in r.items():
            if isinstance(v, dict):
                print(" ", k, json.dumps(v)[:600])
PYEOF
