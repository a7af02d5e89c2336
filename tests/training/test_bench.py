"""The benchmark entry point (training/bench.py) on the CPU: the tiny shape, one gloo process,
in this process (no torchrun start-up), a few steps. Checked against what docs/design.md#measuring-speed
asks to report beside every number, and against the arithmetic of the run itself."""

from __future__ import annotations

import json

import pytest

from training import bench

pytestmark = pytest.mark.timeout(120)

REQUIRED = ("date", "model", "seq_len", "batch", "gpus", "gpu_name", "precision",
            "activation_checkpointing", "compile", "fp8", "strategy", "versions",
            "tokens_per_s_per_gpu", "mfu_pct", "step_time_s", "memory_gib",
            "time_to_first_step_s", "startup_s", "losses", "config")


def test_bench_writes_one_sane_json(tmp_path, world_of_one):
    status = bench.main(["--shape", "tiny", "--seq-len", "32", "--batch-size", "2",
                         "--grad-accum", "2", "--bench-steps", "3", "--bench-warmup", "1",
                         "--activation-checkpointing", "none", "--out", str(tmp_path)])
    assert status == 0
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1, files
    r = json.loads(files[0].read_text())
    missing = [k for k in REQUIRED if k not in r]
    assert not missing, missing
    assert r["status"] == "ok"
    assert "--out" not in r["argv"] and "--bench-steps" in r["argv"]
    assert r["model"]["layers"] == 2 and r["model"]["hidden"] == 64
    assert r["batch"] == {"per_gpu_sequences": 4, "per_gpu_tokens": 128,
                          "micro_batch_sequences": 2, "grad_accum": 2,
                          "global_sequences": 4, "global_tokens": 128}
    assert r["precision"]["master_params"] == r["precision"]["optimizer_states"] == "float32"
    assert len(r["step_times_s"]) == 3 and len(r["losses"]) == 4
    t = r["step_time_s"]
    assert 0 < t["min"] <= t["median"] <= t["max"]
    # tokens/s/GPU is a step's per-GPU tokens (all micro-batches) over the MEAN step time
    assert r["tokens_per_s_per_gpu"] == pytest.approx(128 / t["mean"])
    # random tokens over a 320-word vocabulary: the loss starts near ln(320) = 5.77
    assert abs(r["losses"][0] - 5.77) < 0.5
    assert r["mfu_pct"] is None and r["memory_gib"] is None  # no GPU, no peak: null, not 0
    assert 0 < r["startup_s"]["first_step_s"] < r["time_to_first_step_s"]
