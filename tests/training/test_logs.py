"""The package's own runs show no library log line a user cannot act on (training/logs.py),
and every other warning still shows."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.logs import NOISE, quiet_library_noise

ROOT = Path(__file__).resolve().parents[2]
SEEN = ("Failed to load", "Detected no triton", "is an Enum subclass and is now natively supported")
"""The lines a CPU run printed before the filter (torchao 0.17 and torch 2.13 on this machine)."""


def test_a_cpu_run_prints_none_of_the_library_noise(tmp_path):
    """A one-process run of the fine-tune on CPU (the tiny preset, two steps), as the demo starts
    it: its stderr holds the package's lines and none of the noise."""
    done = subprocess.run(
        [sys.executable, "-m", "training.finetune", "--model", "tiny", "--cache-dir", str(tmp_path / "cache"),
         "--max-steps", "2", "--batch-size", "2", "--val-fraction", "0", "--checkpoint-every", "0",
         "--checkpoint-dir", str(tmp_path / "ck"), "--output-dir", str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 2/2" in done.stderr, done.stderr[-3000:]
    assert [line for line in done.stderr.splitlines() if any(s in line for s in SEEN)] == []


@pytest.mark.parametrize("logger", sorted(NOISE))
def test_only_the_noise_is_dropped(logger, caplog):
    """Each logger's other warnings, and every other logger's, still reach the handlers."""
    quiet_library_noise()
    with caplog.at_level(logging.WARNING):
        logging.getLogger(logger).warning("a warning a user can act on")
        logging.getLogger("elsewhere").warning("Failed to load /x/torchao/_C_y.so: gone")
    assert [r.getMessage() for r in caplog.records] == ["a warning a user can act on",
                                                         "Failed to load /x/torchao/_C_y.so: gone"]


def test_each_pattern_drops_the_line_the_library_prints():
    """The patterns match the library's own wording (copied from the lines a run printed)."""
    printed = {
        "torchao": "Failed to load /v/lib/python3.11/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: "
                   "Could not load this library: /v/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so",
        "torchao.kernel.intmm": "Warning: Detected no triton, on systems without Triton certain kernels will not work",
        "torch.utils._pytree": "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by "
                               "torch.compile as an opaque value type.",
    }
    assert printed.keys() == NOISE.keys()
    assert all(NOISE[name].search(line) for name, line in printed.items())
