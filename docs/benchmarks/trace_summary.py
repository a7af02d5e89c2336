"""Where a profiled step's GPU time goes: python docs/benchmarks/trace_summary.py TRACE.json.gz

Reads the Chrome trace `training.bench --profile-steps` writes (rank 0) and prints, per kernel
category, the summed kernel time per profiled step, plus the compute stream's busy and idle time
over the profiled span. Categories by kernel name: matmul (cuBLAS/CUTLASS), attention (cuDNN /
flash), nccl, optimizer (fused AdamW, foreach kernels), triton (compiled elementwise/norm
kernels), copies (FSDP copy-in/out, casts, memcpy), other.
"""

import gzip
import json
import re
import sys
from collections import defaultdict

CATEGORIES = [
    ("nccl", r"nccl"),
    ("attention", r"cudnn|flash|fmha|sdpa|attention"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|wgmma|f8f8|scaled_mm"),
    ("optimizer", r"adam|multi_tensor|foreach|norm_kernel|lpnorm"),
    ("triton", r"^triton_"),
    ("copies", r"copy|cat|memcpy|memset|split|cast|fill"),
]


def category(name: str) -> str:
    low = name.lower()
    for cat, pattern in CATEGORIES:
        if re.search(pattern, low):
            return cat
    return "other"


def union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main(path: str, steps: int = 1) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    kernels = [e for e in trace["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        print("no GPU kernels in the trace")
        return
    by_stream = defaultdict(list)
    by_cat = defaultdict(float)
    names = defaultdict(float)
    for e in kernels:
        by_stream[e.get("tid")].append((e["ts"], e["ts"] + e["dur"]))
        by_cat[category(e["name"])] += e["dur"]
        names[e["name"][:90]] += e["dur"]
    start = min(a for v in by_stream.values() for a, _ in v)
    end = max(b for v in by_stream.values() for _, b in v)
    span = end - start
    print(f"profiled span {span / 1e3:.1f} ms for {steps} step(s); all-stream busy "
          f"{union([i for v in by_stream.values() for i in v]) / 1e3:.1f} ms")
    for tid, iv in sorted(by_stream.items(), key=lambda kv: -sum(b - a for a, b in kv[1])):
        print(f"  stream {tid}: {len(iv)} kernels, busy {union(iv) / 1e3:.1f} ms "
              f"({100 * union(iv) / span:.1f} %)")
    print("by category (kernel time, all streams, per step):")
    for cat, t in sorted(by_cat.items(), key=lambda kv: -kv[1]):
        print(f"  {cat:10} {t / 1e3 / steps:8.1f} ms")
    print("top kernels (per step):")
    for name, t in sorted(names.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {t / 1e3 / steps:7.1f} ms  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
