#!/usr/bin/env bash
# training.bench beside torchtitan (docs/benchmarks/peer_torchtitan.py) on one nvidia-h200
# machine: each configuration runs ours, then torchtitan's, back to back, so a ratio is only ever
# taken between two runs on the same machine and GPU.
#   bash docs/benchmarks/run_peer.sh PHASE   (from a folder holding training/, benchmarks/, whl/)
# JSONs go to $WORK/json and are packed into $OUT/results-PHASE.tgz after every run; the last
# lines printed are the pair table (docs/benchmarks/peer_table.py).
set -u
PHASE=${1:?phase}
OUT=${OUT:-/tmp/out}
WORK=/tmp/bench
mkdir -p "$OUT" "$WORK/json"
LOG=$OUT/log-$PHASE.txt
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=8
export NCCL_NVLS_ENABLE=0
START=$(date +%s)
BUDGET=${BUDGET:-560}
PY=python3
HERE=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site whl/*.whl >>"$LOG" 2>&1 && echo "wheels installed" | tee -a "$LOG"
export PYTHONPATH=/tmp/site:$HERE
SHAPE="--shape llama2-7b --seq-len 4096 --batch-size 3 --bench-steps 10"
WARMUP=${WARMUP:-3}  # untimed steps of both sides (phase warm and later: 10); a run's own flag wins

elapsed() { echo $(( $(date +%s) - START )); }
pack() { tar czf "$OUT/results-$PHASE.tgz" --exclude='*.trace.json.gz' --exclude='*.memory.pickle' \
  -C "$WORK" json 2>/dev/null; }
run_limited() {  # NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local now; now=$(elapsed)
  if (( now + 40 > BUDGET )); then echo "SKIP $name: budget ($now s used)" | tee -a "$LOG"; return; fi
  (( limit > BUDGET - now )) && limit=$(( BUDGET - now ))
  echo "=== $name: limit ${limit}s: $*" | tee -a "$LOG"
  timeout -k 10 "$limit" "$@" >>"$LOG" 2>&1
  echo "rc=$? $name at $(elapsed) s" | tee -a "$LOG"
  grep -h "tokens/s/GPU\|Error\|error" "$LOG" | tail -2
  pack
}
ours() {  # NAME LIMIT FLAGS...
  local name=$1 limit=$2; shift 2
  run_limited "$name" "$limit" $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
    -m training.bench --tag "$name" --out "$WORK/json" --bench-warmup "$WARMUP" "$@"
}
TITAN_SHAPE="--batch-size 3 --seq-len 4096 --steps 10"  # torchtitan's side of $SHAPE
titan() {  # NAME LIMIT FLAGS...
  local name=$1 limit=$2; shift 2
  # shellcheck disable=SC2086
  run_limited "$name" "$limit" $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
    benchmarks/peer_torchtitan.py --tag "$name" --out "$WORK/json" $TITAN_SHAPE \
    --warmup "$WARMUP" "$@"
}

versions() {  # the GPU and the software, into the log
  { nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv
    $PY -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), transformers.__version__)'; } 2>&1 | tee -a "$LOG"
}

phasepeer() {
  versions
  ours ours-16l-none 110 $SHAPE --layers 16 --activation-checkpointing none --compile
  titan titan-16l-none 110 --layers 16 --ac none
  ours ours-16l-fp8 110 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8 --profile-steps 1
  titan titan-16l-fp8 110 --layers 16 --ac none --float8
  ours ours-7b-full 120 $SHAPE --activation-checkpointing full --compile
  titan titan-7b-full 120 --layers 32 --ac full
  ours ours-16l-none-fsdp 100 $SHAPE --layers 16 --activation-checkpointing none --compile --fsdp-at-world-1
}

convergence() {  # float8 against bf16 on the Brown corpus (fp8_convergence.py): bf16, one float8
  # run per recipe named (default: all three), bf16 again
  local conv=/tmp/conv; mkdir -p $conv
  $PY benchmarks/fp8_convergence.py make $conv/model >>"$LOG" 2>&1
  local common="--model $conv/model --dataset $HERE/data/brown.jsonl --seq-len 1024 --batch-size 8 \
    --max-steps 300 --learning-rate 3e-4 --warmup-steps 20 --activation-checkpointing none --compile \
    --log-every 50 --seed 42"
  local recipes=${*:-tensorwise rowwise rowwise_with_gw_hp} named=() run
  for run in bf16 ${recipes} bf16_again; do
    local flags=""
    case $run in bf16*) ;; *) flags="--precision fp8 --float8-recipe $run"; named+=("fp8-$run=$WORK/json/conv-fp8-$run.jsonl"); run=fp8-$run ;; esac
    # shellcheck disable=SC2086
    run_limited conv-$run 120 $PY -m torch.distributed.run --standalone --nproc-per-node 1 \
      -m training.finetune $common $flags --metrics-file "$WORK/json/conv-$run.jsonl"
  done
  $PY benchmarks/fp8_convergence.py compare "$WORK/json/conv-summary.json" "$WORK/json/conv-bf16.jsonl" \
    "$WORK/json/conv-bf16_again.jsonl" "${named[@]}" 2>&1 | tee -a "$LOG"
  pack
}

phaseconv() {  # float8 convergence, the checkpoint cost, and the float8 pair again
  # after the float8-weight change
  convergence
  df -h /tmp | tee -a "$LOG"
  ours ckpt-7b-8l-fsdp 200 --shape llama2-7b --layers 8 --seq-len 4096 --batch-size 3 --bench-steps 5 \
    --bench-warmup 2 --activation-checkpointing none --compile --fsdp-at-world-1 --checkpoint-cost /tmp/ckpt
  grep -h "checkpoint cost" "$LOG" | tail -4
  ours ours-16l-fp8 110 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  titan titan-16l-fp8 110 --layers 16 --ac none --float8
}

phaseagain() {  # the bf16 pairs again (a second same-call sample), the pinned async checkpoint
  # in steady state (7B shape cut to 4 layers), the float8 pair if time is left
  ours ours-16l-none 110 $SHAPE --layers 16 --activation-checkpointing none --compile
  titan titan-16l-none 110 --layers 16 --ac none
  ours ours-7b-full 120 $SHAPE --activation-checkpointing full --compile
  titan titan-7b-full 120 --layers 32 --ac full
  ours ckpt-7b-4l-fsdp 130 --shape llama2-7b --layers 4 --seq-len 4096 --batch-size 3 --bench-steps 5 \
    --bench-warmup 2 --activation-checkpointing none --compile --fsdp-at-world-1 --checkpoint-cost /tmp/ckpt
  grep -h "checkpoint cost" "$LOG" | tail -4
  ours ours-16l-fp8 110 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  titan titan-16l-fp8 110 --layers 16 --ac none --float8
}

phaseprofile() {  # one profiled step of each side, 16 layers, no AC: where the time goes
  ours ours-16l-none 110 $SHAPE --layers 16 --activation-checkpointing none --compile --profile-steps 1
  titan titan-16l-none 110 --layers 16 --ac none --profile-steps 1
}

phasefinal() {  # the bf16 pairs after the compiled gradient cast
  ours ours-16l-none 100 $SHAPE --layers 16 --activation-checkpointing none --compile
  titan titan-16l-none 100 --layers 16 --ac none
  ours ours-7b-full 100 $SHAPE --activation-checkpointing full --compile
  titan titan-7b-full 100 --layers 32 --ac full
}

phasefused() {  # the pairs after the fused world-size-1 step (training/optim.py): recompiles
  # logged, one profiled step of ours, and the FSDP-at-world-1 run whose losses the local
  # path must repeat
  TORCH_LOGS=recompiles ours ours-16l-none 100 $SHAPE --layers 16 --activation-checkpointing none --compile --profile-steps 1
  titan titan-16l-none 100 --layers 16 --ac none
  ours ours-7b-full 110 $SHAPE --activation-checkpointing full --compile
  titan titan-7b-full 110 --layers 32 --ac full
  ours ours-16l-fp8 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  titan titan-16l-fp8 100 --layers 16 --ac none --float8
  ours ours-16l-none-fsdp 100 $SHAPE --layers 16 --activation-checkpointing none --compile --fsdp-at-world-1
}

phaseexp2() {  # the optimizer step alone (fused_step_bench.py), the three pairs with the exp2
  # update, one profiled float8 step of each side, and the float8 convergence on the new path
  run_limited step-bench 90 $PY benchmarks/fused_step_bench.py --layers 16 --steps 5
  ours ours-16l-none 100 $SHAPE --layers 16 --activation-checkpointing none --compile
  titan titan-16l-none 100 --layers 16 --ac none
  ours ours-7b-full 110 $SHAPE --activation-checkpointing full --compile
  titan titan-7b-full 110 --layers 32 --ac full
  ours ours-16l-fp8 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8 --profile-steps 1
  titan titan-16l-fp8 100 --layers 16 --ac none --float8 --profile-steps 1
  convergence
}

phaseconfirm() {  # the float8 convergence on paragraph records (300 steps each), then a
  # second same-call sample of the three pairs
  convergence
  ours ours-16l-none 100 $SHAPE --layers 16 --activation-checkpointing none --compile
  titan titan-16l-none 100 --layers 16 --ac none
  ours ours-16l-fp8 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  titan titan-16l-fp8 100 --layers 16 --ac none --float8
  ours ours-7b-full 110 $SHAPE --activation-checkpointing full --compile
  titan titan-7b-full 110 --layers 32 --ac full
}

phasefp8w() {  # float8 linears back on their fp32 weights (as under FSDP): its convergence run
  # (compared with the bf16 runs of h200-peer/call8/: the bf16 path is unchanged), its pair, the no-AC pair
  convergence tensorwise
  ours ours-16l-fp8 90 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  titan titan-16l-fp8 90 --layers 16 --ac none --float8
  ours ours-16l-none 90 $SHAPE --layers 16 --activation-checkpointing none --compile
  titan titan-16l-none 90 --layers 16 --ac none
}

PACKED="--doc-lengths 200:400"  # samsum-like records: about 13 documents per row of 4,096

phasepacked() {  # packed rows: the attention kernels alone, the packed-loss test on the GPU,
  # then the bench plain, packed on the old dense-mask path, packed on FlexAttention, and
  # torchtitan's block-causal FlexAttention on the same rows
  versions
  run_limited attn-bench 150 $PY benchmarks/packed_attention_bench.py $PACKED --out "$WORK/json"
  grep -h "^sdpa\|^flex\|^varlen" "$LOG" | tail -5
  run_limited gpu-test 150 $PY -m pytest -x -q -p no:cacheprovider tests/training/test_data.py \
    -k "packed or one_document"
  ours ours-16l-none 100 $SHAPE --layers 16 --activation-checkpointing none --compile
  ours ours-16l-packed-sdpa 110 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED --packed-attention sdpa
  ours ours-16l-packed-flex 120 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED
  titan titan-16l-packed-flex 170 --layers 16 --ac none $PACKED --attn flex
}

phasegc() {  # the stall: the packed FlexAttention bench, 20 timed steps, three runs with
  # Python's automatic garbage collection and three with it off (--gc-every 50), alternating;
  # first the packed-loss test on the GPU
  run_limited gpu-test 150 $PY -m pytest -x -q -p no:cacheprovider tests/training/test_data.py \
    -k "packed or one_document"
  for i in 1 2 3; do
    ours ours-16l-packed-gcauto-$i 90 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED --bench-steps 20
    ours ours-16l-packed-gc50-$i 90 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED --bench-steps 20 --gc-every 50
  done
}

phasepair() {  # the packed-loss test on the GPU (without the infra tests' conftest, which
  # needs Pulumi), a second same-call sample of the packed pair, torchtitan's varlen attention
  run_limited gpu-test 150 $PY -m pytest -x -q -p no:cacheprovider --noconftest \
    tests/training/test_data.py -k "packed or one_document"
  ours ours-16l-packed-flex 100 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED
  titan titan-16l-packed-flex 120 --layers 16 --ac none $PACKED --attn flex
  titan titan-16l-packed-varlen 120 --layers 16 --ac none $PACKED --attn varlen
}

phasemask() {  # the block mask built from the documents' tile ranges (no longer by
  # create_block_mask): the kernels again (its correctness against fp32 at 4,096 and its build
  # time), then the packed pair
  run_limited attn-bench 150 $PY benchmarks/packed_attention_bench.py $PACKED --out "$WORK/json"
  grep -h "^sdpa\|^flex\|^varlen\|block_mask_ms" "$LOG" | tail -6
  ours ours-16l-packed-flex 100 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED
  titan titan-16l-packed-flex 120 --layers 16 --ac none $PACKED --attn flex
}

pairs() {  # ours and torchtitan on each named setup: none (16 layers, no AC), fp8 (the same in
  # float8, tensorwise), packed (16 layers, no AC, samsum-like packed rows, block-causal
  # FlexAttention on both sides), full (Llama-2-7B, full AC); $OURS_FLAGS go to ours only
  local setup; for setup in "$@"; do case $setup in
    none) ours ours-16l-none 100 $SHAPE --layers 16 --activation-checkpointing none --compile ${OURS_FLAGS:-}
          titan titan-16l-none 100 --layers 16 --ac none ;;
    fp8) ours ours-16l-fp8 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8 ${OURS_FLAGS:-}
         titan titan-16l-fp8 100 --layers 16 --ac none --float8 ;;
    packed) ours ours-16l-packed-flex 100 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED ${OURS_FLAGS:-}
            titan titan-16l-packed-flex 120 --layers 16 --ac none $PACKED --attn flex ;;
    full) ours ours-7b-full 110 $SHAPE --activation-checkpointing full --compile
          titan titan-7b-full 110 --layers 32 --ac full ;;
  esac; done
}

phaseloss() {  # the fused loss's per-chunk arithmetic compiled: the four pairs (one profiled
  # step of ours without AC), then the float8 recipes' speed beside tensorwise
  versions
  OURS_FLAGS="--profile-steps 1" pairs none
  pairs fp8 packed full
  ours ours-16l-fp8-rowwise 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8 --float8-recipe rowwise
  ours ours-16l-fp8-rowwise_with_gw_hp 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8 --float8-recipe rowwise_with_gw_hp
}

phaserecipes() {  # the float8 recipes' convergence, then a second same-call sample of three pairs
  convergence
  pairs none fp8 packed
}

phasethird() {  # a third sample of the four pairs
  pairs none fp8 packed full
}

phasesync() {  # the package builds every attention mask itself (transformers' mask builder
  # read a value back from the GPU every forward) and the bench draws each step's rows while
  # the step before runs: the packed-loss tests on the GPU, the three 1-GPU pairs (two profiled
  # float8 steps of ours), then ours again on float8 and packed rows (stall criterion)
  versions
  run_limited gpu-test 120 $PY -m pytest -x -q -p no:cacheprovider --noconftest \
    tests/training/test_data.py -k "packed or one_document or mask"
  pairs none
  OURS_FLAGS="--profile-steps 2" pairs fp8
  pairs packed
  ours ours-16l-fp8-2 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  ours ours-16l-packed-flex-2 100 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED
}

phaseclocks() {  # the GPU's SM clock beside every timed step (training/gpu_clocks.py): the
  # float8 pair after 3 warm-up steps, then after 10 (is the slow first step the GPU's power
  # management settling after the compile's idle seconds?), then the other pairs again
  pairs fp8
  ours ours-16l-fp8-w10 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8 --bench-warmup 10
  titan titan-16l-fp8-w10 100 --layers 16 --ac none --float8 --warmup 10
  pairs none packed full
  ours ours-16l-none-2 100 $SHAPE --layers 16 --activation-checkpointing none --compile
}

phasewarm() {  # 10 warm-up steps on both sides (the clock settles: phase clocks): the three
  # 16-layer pairs again, and ours in float8 again (stall criterion: three runs each)
  WARMUP=10
  pairs fp8 none packed
  ours ours-16l-fp8-2 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  pairs full
}

llama3() {  # the Llama-3-8B shape (8 KV heads, vocabulary 128,256), batch 2 x 4,096, 20 timed
  # steps after 10 warm-up steps on both sides; torchtitan its own 8B flavor cut to the layers
  SHAPE="--shape llama3-8b --seq-len 4096 --batch-size 2 --bench-steps 20"
  TITAN_SHAPE="--shape llama3-8b --batch-size 2 --seq-len 4096 --steps 20"
  WARMUP=10
}

l3pairs() {  # as `pairs`, on the Llama-3 shape: none (16 layers, no AC), packed (16 layers,
  # samsum-like packed rows, block-causal FlexAttention both sides), full (32 layers, full AC)
  llama3
  local setup; for setup in "$@"; do case $setup in
    none) ours ours-l3-16l-none 110 $SHAPE --layers 16 --activation-checkpointing none --compile ${OURS_FLAGS:-}
          titan titan-l3-16l-none 110 --layers 16 --ac none ${TITAN_FLAGS:-} ;;
    packed) ours ours-l3-16l-packed-flex 110 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED ${OURS_FLAGS:-}
            titan titan-l3-16l-packed-flex 130 --layers 16 --ac none $PACKED --attn flex ${TITAN_FLAGS:-} ;;
    full) ours ours-l3-32l-full 130 $SHAPE --activation-checkpointing full --compile
          titan titan-l3-32l-full 130 --layers 32 --ac full ;;
  esac; done
}

phasel3() {  # the Llama-3 shape beside torchtitan's llama3 8B flavor: one profiled step of each
  # side without AC (where the time goes), the packed pair, then 32 layers with full AC
  versions
  $PY -c 'from torch import nn; print("nn.LinearCrossEntropyLoss:", hasattr(nn, "LinearCrossEntropyLoss"))' 2>&1 | tee -a "$LOG"
  OURS_FLAGS="--profile-steps 1" TITAN_FLAGS="--profile-steps 1" l3pairs none
  l3pairs packed full
}

phasel3grad() {  # the fused loss with one logit-gradient matmul per group: the three Llama-3
  # pairs (one profiled step of ours), then the fine-tune itself on samsum-shaped packed rows
  # (finetune_packed.py: 16 layers, batch 2, FlexAttention, 30 steps) beside the packed bench
  versions
  OURS_FLAGS="--profile-steps 1" l3pairs none
  l3pairs packed full
  run_limited ft-l3-16l-packed 200 env SHAPE=llama3-8b PATHS=flex BATCH=2 STEPS=30 \
    $PY benchmarks/finetune_packed.py /tmp/ft "$WORK/json" 16
  grep -h "^flex" "$LOG" | tail -1
}

phasel3harness() {  # a second harness's settings on torchtitan's side (its metrics logging,
  # a host sync, every 5 steps; 10 warm-up and 20 timed steps): the Llama-2 pairs with the
  # grouped loss gradients first (team harness), then the Llama-3 pairs with --log-freq 5
  versions
  WARMUP=10
  pairs none fp8 packed
  TITAN_FLAGS="--log-freq 5" l3pairs none packed
}

phasel3third() {  # a third sample of the Llama-3 16-layer pair without AC (the team harness)
  l3pairs none
}

harnesses() {  # NAME LIMIT FLAGS...: torchtitan in the team's harness (titan-NAME) and with
  # its own metrics logging every 5 steps (titan5-NAME, the second harness), beside one ours-NAME
  local name=$1 limit=$2; shift 2
  titan "titan-$name" "$limit" "$@"
  titan "titan5-$name" "$limit" "$@" --log-freq 5
}

memory_peaks() {  # what is live at the peak of each recorded step (--memory-snapshot runs)
  local snap; for snap in "$WORK"/json/*.memory.pickle; do
    [ -f "$snap" ] || continue
    $PY benchmarks/memory_peak.py "$snap" --top 20 2>&1 | tee -a "$LOG"
    gzip -c "$snap" >"$OUT/$(basename "$snap").gz"
  done
}

phasel3pin() {  # the update kernel's launch configuration fixed at compile time (optim.py): the
  # Llama-3 pairs without AC (one profiled step of ours) and with full AC (one more step of ours
  # recorded for what is live at its memory peak), the Llama-2 full-AC pair; torchtitan in both
  # harnesses each time
  versions
  llama3
  ours ours-l3-16l-none 110 $SHAPE --layers 16 --activation-checkpointing none --compile --profile-steps 1
  harnesses l3-16l-none 110 --layers 16 --ac none
  ours ours-l3-32l-full 150 $SHAPE --activation-checkpointing full --compile --memory-snapshot
  harnesses l3-32l-full 130 --layers 32 --ac full
  memory_peaks
  SHAPE="--shape llama2-7b --seq-len 4096 --batch-size 3 --bench-steps 20"
  TITAN_SHAPE="--batch-size 3 --seq-len 4096 --steps 20"
  ours ours-7b-full 120 $SHAPE --activation-checkpointing full --compile
  harnesses 7b-full 120 --layers 32 --ac full
}

phasel3fin() {  # the Llama-2 16-layer setups (no AC, float8, packed rows) with torchtitan in
  # both harnesses, then the Llama-3 packed pair in the second harness; 20 timed steps each
  versions
  SHAPE="--shape llama2-7b --seq-len 4096 --batch-size 3 --bench-steps 20"
  TITAN_SHAPE="--batch-size 3 --seq-len 4096 --steps 20"
  WARMUP=10
  ours ours-16l-none 100 $SHAPE --layers 16 --activation-checkpointing none --compile
  harnesses 16l-none 100 --layers 16 --ac none
  ours ours-16l-fp8 100 $SHAPE --layers 16 --activation-checkpointing none --compile --precision fp8
  harnesses 16l-fp8 100 --layers 16 --ac none --float8
  ours ours-16l-packed-flex 100 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED
  harnesses 16l-packed-flex 120 --layers 16 --ac none $PACKED --attn flex
  llama3
  ours ours-l3-16l-packed-flex 110 $SHAPE --layers 16 --activation-checkpointing none --compile $PACKED
  titan titan5-l3-16l-packed-flex 130 --layers 16 --ac none $PACKED --attn flex --log-freq 5
}

"phase$PHASE"
pack
echo "--- phase $PHASE done at $(elapsed) s"
cp "$WORK"/json/*.trace.json.gz "$OUT"/ 2>/dev/null
for t in "$WORK"/json/*.trace.json.gz; do [ -f "$t" ] && echo "== $t" && $PY benchmarks/trace_summary.py "$t" 2>&1 | head -32; done
$PY benchmarks/peer_table.py "$WORK/json"
