"""What is live at the peak of a recorded step: the allocations the step made that were still
held when its allocated memory was highest, grouped by where they were made.

    python docs/benchmarks/memory_peak.py RUN.memory.pickle [--top 15]

The snapshot is the one `python -m training.bench --memory-snapshot` writes beside its JSON
(`torch.cuda.memory._dump_snapshot` after one step recorded with Python stacks). Its trace is
replayed event by event: an allocation adds its size, a completed free takes it away (also for
blocks made before the recording began, whose allocation the trace does not hold). The memory
held before the step is what the allocator held at the dump minus what the step left behind.

Prints the peak (GiB, and above the memory held before the step), the stack of the allocation
that reached it, and the step's live blocks at that moment by site: the innermost frame in the
package's own code (training/), else in transformers, else the innermost frame.
"""

from __future__ import annotations

import argparse
import collections
import pickle
import sys

GIB = 2**30
OWN_CODE = ("/training/", "/transformers/")


def replay(trace: list[dict]) -> tuple[int, int, int, dict[int, dict]]:
    """(net bytes the trace left allocated, its highest running total, the index of the event
    that reached it, the blocks allocated in the trace and live at that event by address)."""
    level = peak = 0
    peak_at = -1
    for i, event in enumerate(trace):
        level += _delta(event)
        if level > peak:
            peak, peak_at = level, i
    live: dict[int, dict] = {}
    for event in trace[:peak_at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    return level, peak, peak_at, live


def _delta(event: dict) -> int:
    if event["action"] == "alloc":
        return event["size"]
    if event["action"] == "free_completed":
        return -event["size"]
    return 0


def site(frames: list[dict]) -> str:
    """Where a block was made: the innermost frame of the package's own code or of
    transformers, else the innermost frame (frames run innermost first)."""
    for prefix in OWN_CODE:
        for frame in frames:
            if prefix in frame["filename"]:
                return _where(frame)
    return _where(frames[0]) if frames else "(no stack)"


def _where(frame: dict) -> str:
    path = frame["filename"]
    for prefix in OWN_CODE:
        if prefix in path:
            path = prefix.strip("/") + "/" + path.split(prefix, 1)[1]
    return f"{path}:{frame['line']} {frame['name']}"


def held_at_end(snapshot: dict, device: int) -> int:
    """Bytes the allocator held in live blocks when the snapshot was dumped."""
    return sum(block["size"] for segment in snapshot["segments"] if segment["device"] == device
               for block in segment["blocks"] if block["state"] == "active_allocated")


def summary(snapshot: dict, device: int = 0, top: int = 15) -> list[str]:
    """The report's lines (module docstring)."""
    trace = snapshot["device_traces"][device]
    net, peak, peak_at, live = replay(trace)
    before = held_at_end(snapshot, device) - net
    lines = [f"peak {(before + peak) / GIB:.3f} GiB: {peak / GIB:.3f} GiB above the "
             f"{before / GIB:.3f} GiB held before the step ({len(trace)} events, peak at "
             f"event {peak_at})"]
    if peak_at >= 0:
        lines.append("the allocation that reached it:")
        lines += [f"    {_where(f)}" for f in trace[peak_at].get("frames", [])[:8]]
    by_site: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for event in live.values():
        entry = by_site[site(event.get("frames", []))]
        entry[0] += event["size"]
        entry[1] += 1
    lines.append(f"live at the peak, made during the step: "
                 f"{sum(e['size'] for e in live.values()) / GIB:.3f} GiB in {len(live)} blocks")
    for where, (size, count) in sorted(by_site.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {size / 2**20:10.1f} MiB {count:5d}  {where}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("snapshot")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    print("\n".join(summary(snapshot, args.device, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
