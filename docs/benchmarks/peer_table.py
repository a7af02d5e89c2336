"""Pair table of one device call: `ours-NAME` (training.bench) beside `titan-NAME`
(peer_torchtitan.py), ratio = ours / torchtitan tokens/s/GPU, each side's slowest timed step
over its median (a stall shows there); beside `titan5-NAME` too where it ran (a second harness:
torchtitan's own metrics logging every 5 steps, `--log-freq 5`; its peak memory is not
comparable, since that logging resets the peak statistics at each log step); and where
`ours-NAME-fsdp` ran too (fully_shard at world size 1 with PyTorch's fused AdamW), how far the local path's
losses are from it, step by step; then each run's timed steps beside the GPU's mean SM clock
during each (training/gpu_clocks.py), where it was sampled.  python peer_table.py DIR"""

import glob
import sys

import records


PEERS = (("titan-", ""), ("titan5-", " (torchtitan logging every 5 steps)"))
"""Tag prefix of each torchtitan run beside ours, and what its row adds to the name."""


def load(folder: str) -> dict[str, dict]:
    runs = {}
    for path in sorted(glob.glob(f"{folder}/*.json")):
        r = records.load(path)
        if "perf/tokens_per_s_per_gpu" in r:
            runs[r["tag"]] = r
    return runs


def paired(runs: dict[str, dict]) -> list[tuple[str, dict, list[tuple[str, dict]]]]:
    """Per run of ours: its name (the tag after `ours-`), its record, and the torchtitan runs
    beside it as (label, record), in `PEERS` order."""
    out = []
    for tag, r in runs.items():
        if tag.startswith("ours-"):
            name = tag[len("ours-"):]
            peers = [(label, runs[prefix + name]) for prefix, label in PEERS
                     if prefix + name in runs]
            out.append((name, r, peers))
    return out


def max_over_median(r: dict) -> str:
    value = (r.get("step_time_s") or {}).get("max_over_median")
    return "-" if value is None else f"{value:.3f}"


def main(folder: str) -> None:
    runs = load(folder)
    print("| configuration | ours tok/s/GPU | torchtitan tok/s/GPU | ratio | ours max/median step | "
          "torchtitan max/median step | ours peak alloc GiB | torchtitan peak alloc GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r, peers in paired(runs):
        ours = r["perf/tokens_per_s_per_gpu"]
        mem = (r.get("memory_gib") or {}).get("peak_allocated", 0)
        for label, peer in peers:
            theirs = peer["perf/tokens_per_s_per_gpu"]
            peer_mem = "-" if label else f"{peer['memory_gib']['peak_allocated']:.1f}"
            print(f"| {name}{label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.3f} | "
                  f"{max_over_median(r)} | {max_over_median(peer)} | {mem:.1f} | {peer_mem} |")
        if not peers:
            print(f"| {name} | {ours:,.0f} | - | - | {max_over_median(r)} | - | {mem:.1f} | - |")
    for tag, r in runs.items():
        fsdp = runs.get(tag + "-fsdp")
        if tag.startswith("ours-") and fsdp:
            diffs = [abs(a - b) / abs(b) for a, b in zip(r["losses"], fsdp["losses"])]
            print(f"{tag} vs {tag}-fsdp: {len(diffs)} losses, largest relative difference "
                  f"{max(diffs):.2e} (step {diffs.index(max(diffs)) + 1}); tokens/s ratio "
                  f"{r['perf/tokens_per_s_per_gpu'] / fsdp['perf/tokens_per_s_per_gpu']:.3f}")
    for tag, r in runs.items():
        clocks = r.get("gpu_clock_per_step")
        if clocks:
            steps = " ".join(f"{t * 1e3:.0f}@{c['sm_clock_mhz']:.0f}" if c["sm_clock_mhz"] else
                             f"{t * 1e3:.0f}@-" for t, c in zip(r["step_times_s"], clocks))
            print(f"{tag}: step ms @ SM MHz: {steps}")


if __name__ == "__main__":
    main(sys.argv[1])
