#!/usr/bin/env bash
# Local demo: fine-tune the tiny preset with 2 CPU processes through torchrun, with the same
# entry point and flags as the PyTorchJob. First the node check's table (training/node_check.py:
# this machine's limits, /dev/shm, the checkpoint directory's MB/s, gloo bus bandwidth at the
# tiny model's FSDP sizes); a failed check would stop here. Then loss and tokens/s per step, the validation
# loss and perplexity every 7 steps (5 % of the shipped examples, held out), then a summary;
# writes checkpoints, the Hugging Face export of the best checkpoint and metrics.jsonl under OUT
# (default out/finetune).
# Finishes in well under a minute on 2 cores. Started through training.launch (torchrun's main,
# as the PyTorchJob's pods): Ctrl-C saves the step in flight and ends with one line and status
# 130 (training/termination.py), without torchrun's traceback; the next demo starts afresh all
# the same (below), while the same command by hand would resume from that checkpoint.
#   usage: bash training/demo.sh [OUT]      (PYTHON=... to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/finetune}
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
rm -rf "$OUT/checkpoints" "$OUT/model" "$OUT/metrics.jsonl"   # a fresh run, not a resume
mkdir -p "$OUT"
# One thread per process (2 processes on 2 cores); torchrun's shared rendezvous store breaks
# restarts (pytorch/pytorch#135712), so the PyTorchJob sets this too.
export OMP_NUM_THREADS=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 TOKENIZERS_PARALLELISM=false
set -x
"$PYTHON" -m training.launch --standalone --nproc-per-node=2 -m training.finetune \
  --model tiny --cache-dir "$OUT/cache" \
  --seq-len 512 --batch-size 4 --grad-accum 2 --epochs 2 \
  --learning-rate 3e-3 --warmup-steps 3 --sharding FULL_SHARD --activation-checkpointing selective \
  --val-fraction 0.05 --eval-every 7 --keep-best \
  --checkpoint-dir "$OUT/checkpoints" --checkpoint-every 20 --keep-checkpoints 2 \
  --output-dir "$OUT/model" --export-dtype bf16 --metrics-file "$OUT/metrics.jsonl" \
  --log-every 5
