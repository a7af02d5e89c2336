"""FSDP's collectives at the 7B layer size, between the GPUs of one host (torchrun, NCCL).

all_gather_into_tensor of one Llama-2-7B decoder layer in bf16 (202.4 M parameters, 405 MB
gathered) and reduce_scatter_tensor of its gradient in fp32 (810 MB in), as FSDP2 does per layer
with our mixed-precision policy; plus an fp32 all_reduce of the same size (HSDP's cross-replica
step). Median of 20 after 5 warm-ups; bus bandwidth as nccl-tests defines it. Rank 0 prints JSON.
"""

import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
from h200_calibrate import timed as calibrate_timed  # same folder: on sys.path when run as a script

LAYER = 202_383_360  # 4 h^2 + 3 h i for h 4096, i 11008


def timed(fn, reps=20, warm=5):
    """Median seconds of ``fn`` (the timing loop of h200_calibrate, beside this script)."""
    return statistics.median(calibrate_timed(fn, reps, warm))


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    n = LAYER // world * world
    shard_bf16 = torch.randn(n // world, device="cuda", dtype=torch.bfloat16)
    full_bf16 = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    full_fp32 = torch.randn(n, device="cuda")
    shard_fp32 = torch.empty(n // world, device="cuda")
    out = {"world": world, "elements": n}
    t = timed(lambda: dist.all_gather_into_tensor(full_bf16, shard_bf16))
    out["all_gather_bf16_ms"] = 1e3 * t
    out["all_gather_busbw_gb_s"] = 2 * n / t * (world - 1) / world / 1e9
    t = timed(lambda: dist.reduce_scatter_tensor(shard_fp32, full_fp32))
    out["reduce_scatter_fp32_ms"] = 1e3 * t
    out["reduce_scatter_busbw_gb_s"] = 4 * n / t * (world - 1) / world / 1e9
    t = timed(lambda: dist.all_reduce(full_fp32))
    out["all_reduce_fp32_ms"] = 1e3 * t
    out["all_reduce_busbw_gb_s"] = 4 * n / t * 2 * (world - 1) / world / 1e9
    if rank == 0:
        text = json.dumps(out, indent=1)
        print(text)
        if len(sys.argv) > 1:
            open(sys.argv[1], "w").write(text + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
