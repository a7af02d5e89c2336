"""The benchmark entry point (training/bench.py) on the CPU: the tiny shape, one gloo process,
in this process (no torchrun start-up), a few steps. Checked against what docs/design.md#measuring-speed
asks to report beside every number, and against the arithmetic of the run itself."""

from __future__ import annotations

import json

import pytest

from training import bench

pytestmark = pytest.mark.timeout(120)

REQUIRED = ("date", "run/model", "run/params", "run/seq_len", "batch", "run/gpus", "run/device",
            "run/param_dtype", "run/reduce_dtype", "run/optimizer_state_dtype",
            "run/activation_checkpointing", "run/compile", "run/precision", "strategy",
            "run/torch", "versions", "perf/tokens_per_s_per_gpu", "perf/mfu_pct",
            "perf/step_time_s", "step_time_s", "memory_gib", "time_to_first_step_s", "startup_s",
            "losses", "config")
"""The fine-tune's names (`run/*` of its summary, `perf/*` of its step metrics) for what both
report; the bench's own names for the rest."""


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
    assert r["run/layers"] == 2 and r["run/hidden"] == 64 and r["model"]["vocab"] == 320
    assert r["run/model"] == "random init, shape tiny"
    assert (r["run/seq_len"], r["run/gpus"], r["run/device"]) == (32, 1, "cpu")
    assert r["batch"] == {"per_gpu_sequences": 4, "per_gpu_tokens": 128,
                          "micro_batch_sequences": 2, "grad_accum": 2, "global_sequences": 4}
    assert r["run/tokens_per_global_batch"] == 128
    assert r["precision"]["master_params"] == r["run/optimizer_state_dtype"] == "float32"
    assert len(r["step_times_s"]) == 3 and len(r["losses"]) == 4
    t = r["step_time_s"]
    assert 0 < t["min"] <= t["median"] <= t["max"]
    # the mean step: on the CPU the per-step times are consecutive host stamps, so they add up
    # to the wall-clock time of the timed steps (which ends after one more sync call)
    assert r["perf/step_time_s"] == pytest.approx(sum(r["step_times_s"]) / 3, rel=0.01)
    # tokens/s/GPU is a step's per-GPU tokens (all micro-batches) over the MEAN step time
    assert r["perf/tokens_per_s_per_gpu"] == pytest.approx(128 / r["perf/step_time_s"])
    assert r["perf/tflops_per_gpu"] == pytest.approx(
        r["perf/tokens_per_s_per_gpu"] * r["run/flops_per_token"] / 1e12)
    # random tokens over a 320-word vocabulary: the loss starts near ln(320) = 5.77
    assert abs(r["losses"][0] - 5.77) < 0.5
    assert r["perf/mfu_pct"] is None and r["memory_gib"] is None  # no GPU, no peak: null, not 0
    assert 0 < r["startup_s"]["first_step_s"] < r["time_to_first_step_s"]


def test_bench_packed_rows_are_the_fine_tunes_packing(tmp_path, world_of_one):
    """--doc-lengths: rows packed by the fine-tune's `dataset.pack` from documents whose
    lengths lie in the range; checked against the packing rule (whole documents, positions
    restarting at each, no target across a boundary) and the JSON's record of it."""
    import torch

    rows = bench.packed_rows(torch.Generator().manual_seed(1), 320, 3, 256,
                             bench.document_lengths("20:60"))
    assert rows.inputs.shape == (3, 256)
    for r in range(3):
        starts = (rows.positions[r] == 0).nonzero().flatten().tolist()
        docs = starts[:rows.documents[r]]  # the rest is the padding's restart, if any
        ends = docs[1:] + [starts[len(docs)] if len(starts) > len(docs) else 256]
        for a, b in zip(docs, ends):
            assert 20 <= b - a <= 60
            assert rows.inputs[r, a] == bench.BOS_ID and rows.inputs[r, b - 1] == bench.EOS_ID
            assert rows.targets[r, b - 1] == -100  # the last token predicts nothing
        assert ends[-1] + 60 > 256  # the next document did not fit: the row was closed
    status = bench.main(["--shape", "tiny", "--seq-len", "256", "--batch-size", "2",
                         "--bench-steps", "2", "--bench-warmup", "1", "--doc-lengths", "20:60",
                         "--activation-checkpointing", "none", "--out", str(tmp_path)])
    assert status == 0
    r = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert r["packed"]["micro_batches"] == 3
    assert 256 / 60 - 1 <= r["packed"]["documents_per_row"]["mean"] <= 256 / 20
    assert r["run/packed_attention"] == "sdpa"  # the CPU has no FlexAttention backward
    t = r["step_time_s"]
    assert t["max_over_median"] == pytest.approx(t["max"] / t["median"])


@pytest.mark.parametrize("spec", ["1:5", "x:y", "7", "/nonexistent/lengths.txt"])
def test_bad_doc_lengths_name_the_flag(spec, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--shape", "tiny", "--doc-lengths", spec])
    assert f"--doc-lengths {spec}" in capsys.readouterr().err
