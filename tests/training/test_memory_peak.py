"""docs/benchmarks/memory_peak.py, the reader of the bench's --memory-snapshot, on snapshots
whose peak is known by construction (the format is torch.cuda.memory._snapshot's)."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "memory_peak.py"


@pytest.fixture(scope="module")
def memory_peak():
    spec = importlib.util.spec_from_file_location("memory_peak", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _frames(*where):
    return [{"filename": f, "line": line, "name": name} for f, line, name in where]


LOSS = _frames(("/usr/lib/python3/site-packages/torch/functional.py", 10, "mm"),
               ("/srv/app/training/loss.py", 91, "forward"),
               ("/srv/app/training/bench.py", 250, "step"))
LAYER = _frames(("/usr/lib/python3/site-packages/torch/_ops.py", 5, "__call__"),
                ("/usr/lib/python3/site-packages/transformers/models/llama/modeling_llama.py",
                 300, "forward"))
OTHER = _frames(("/usr/lib/python3/site-packages/torch/optim/adamw.py", 7, "step"))


def _snapshot(trace, held_at_end):
    blocks = [{"size": size, "state": "active_allocated"} for size in held_at_end]
    blocks.append({"size": 999, "state": "inactive"})  # cached, not allocated: not counted
    return {"segments": [{"device": 0, "blocks": blocks}], "device_traces": [trace]}


def test_the_peak_its_live_blocks_and_what_was_held_before(memory_peak):
    """A block made before the recording (freed in the step), then three allocations of which
    one is freed before the highest point and one after: the peak is 300 above the start, its
    live blocks are the loss's 200 and the layer's 100, and the memory held before the step is
    recovered from the dump (1,000 held at the end minus the step's net +250)."""
    trace = [
        {"action": "free_requested", "addr": 1, "size": 50, "frames": OTHER},
        {"action": "free_completed", "addr": 1, "size": 50, "frames": OTHER},  # -50
        {"action": "alloc", "addr": 2, "size": 150, "frames": OTHER},  # 100
        {"action": "alloc", "addr": 3, "size": 100, "frames": LAYER},  # 200
        {"action": "free_completed", "addr": 2, "size": 150, "frames": OTHER},  # 50
        {"action": "alloc", "addr": 4, "size": 200, "frames": LOSS},  # 250
        {"action": "segment_alloc", "addr": 9, "size": 10**6, "frames": OTHER},  # not a block
        {"action": "alloc", "addr": 5, "size": 50, "frames": OTHER},  # 300: the peak
        {"action": "free_completed", "addr": 5, "size": 50, "frames": OTHER},  # 250
    ]
    net, peak, peak_at, live = memory_peak.replay(trace)
    assert (net, peak, peak_at) == (250, 300, 7)
    assert sorted(live) == [3, 4, 5]
    lines = memory_peak.summary(_snapshot(trace, [600, 400]))
    assert lines[0].startswith("peak 0.000 GiB")
    held_before = 1000 - 250
    assert f"{held_before / 2**30:.3f} GiB held before" in lines[0]
    assert "peak at event 7" in lines[0]
    assert any("torch/optim/adamw.py:7 step" in line for line in lines[1:3])
    sites = [line for line in lines if " MiB " in line]
    assert "training/loss.py:91 forward" in sites[0]  # the largest first, the package's frame
    assert "transformers/models/llama/modeling_llama.py:300 forward" in sites[1]
    assert "adamw.py:7 step" in sites[2]


def test_the_script_reads_a_dumped_pickle(memory_peak, tmp_path, capsys):
    """The command line: a pickle on disk, the report printed."""
    trace = [{"action": "alloc", "addr": 1, "size": 3 * 2**30, "frames": LOSS}]
    path = tmp_path / "run.memory.pickle"
    path.write_bytes(pickle.dumps(_snapshot(trace, [4 * 2**30])))
    assert memory_peak.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("peak 4.000 GiB: 3.000 GiB above the 1.000 GiB held before the step")
    assert "3072.0 MiB     1  training/loss.py:91 forward" in out


def test_a_recorded_h200_step_peaks_where_the_allocator_counted_it(memory_peak):
    """Checked against the allocator's own counter: the snapshot recorded on one H200
    (docs/benchmarks/h200-llama3/call5, Llama-3 shape, 32 layers, full AC) replays to the peak
    that torch.cuda.max_memory_allocated reported for that run's timed steps (its JSON), within
    0.01 GiB, and the allocation that reached it is the fused loss's."""
    import gzip
    import json

    call = SCRIPT.parent / "h200-llama3" / "call5"
    with gzip.open(call / "ours-l3-32l-full.memory.pickle.gz") as f:
        snapshot = pickle.load(f)
    record = json.loads(next(call.glob("ours-l3-32l-full-*.json")).read_text())
    lines = memory_peak.summary(snapshot)
    peak = float(lines[0].split()[1])
    assert abs(peak - record["memory_gib"]["peak_allocated"]) < 0.01
    assert "training/loss.py" in lines[2]
