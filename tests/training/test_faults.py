"""Faults under torchrun with restarts allowed: a worker SIGKILLed mid-run, and a worker killed
while writing a checkpoint. Both must end where an uninterrupted run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.training.conftest import (
    REPO,
    STEPS,
    TINY_FLAGS,
    Run,
    assert_losses_close,
    child_env,
    steps_of,
    torchrun_cmd,
    train,
)
from training.checkpoint import COMPLETE_MARKER, complete_checkpoints

pytestmark = pytest.mark.timeout(300)

N = STEPS // 2
BITWISE_RTOL = 1e-6
"""A restarted job redoes exactly the same arithmetic as the uninterrupted one (measured:
identical fp32 losses)."""


def _workers(agent_pid: int) -> dict[int, int]:
    """RANK -> pid of the worker processes that the torchrun agent `agent_pid` started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != agent_pid:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for var in env:
            if var.startswith(b"RANK="):
                found[int(var[5:])] = int(entry.name)
    return found


def test_sigkill_worker_restarts_and_matches_uninterrupted(reference, tmp_path, tiny_cache):
    """Checked against the uninterrupted reference run: rank 1 is SIGKILLed after step N+1
    (past the step-N checkpoint); torchrun (--max-restarts=1) restarts the group, which
    resumes from step N's checkpoint, redoes the lost step, and ends with the reference's
    losses at every step, the final one included."""
    ckpt = tmp_path / "ckpt"
    metrics = tmp_path / "metrics.jsonl"
    cmd = torchrun_cmd(2, ["--standalone", "--max-restarts=1", "--monitor-interval=0.5"]) + [
        *TINY_FLAGS, "--cache-dir", str(tiny_cache), "--batch-size", "4",
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(N),
        "--metrics-file", str(metrics)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(FSDP_EKS_TEST_STEP_DELAY_S="0.5"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while max(steps_of(metrics), default=0) < N + 1:
            assert proc.poll() is None, f"run ended early:\n{proc.stdout.read()[-4000:]}"
            assert time.monotonic() < deadline, "the run never reached step N+1"
            time.sleep(0.05)
        assert [s for s, _ in complete_checkpoints(ckpt)] == [N]
        victim = _workers(proc.pid)[1]
        os.kill(victim, signal.SIGKILL)
        killed_at = max(steps_of(metrics))
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    run = Run(proc.returncode, out, tmp_path).check()
    assert killed_at < STEPS, "the kill landed after the last step"
    assert f"resumed from {ckpt}/step_{N:08d}" in out
    assert_losses_close(run.losses(), reference.losses(), BITWISE_RTOL, "killed + restarted")
    assert run.losses()[-1] == reference.losses()[-1]


def test_killed_while_saving_resumes_from_previous_checkpoint(reference, tmp_path, tiny_cache):
    """Checked against the uninterrupted reference run: the last rank dies (SIGKILL, test hook)
    after writing its shards of the step-2N checkpoint but before it is marked complete; the
    restarted group ignores that half-written checkpoint, resumes from step N's, and finishes
    with the reference's losses; only complete checkpoints remain."""
    ckpt = tmp_path / "ckpt"
    run = train(tmp_path, "--batch-size", "4", "--checkpoint-dir", str(ckpt),
                "--checkpoint-every", str(N), cache=tiny_cache,
                launcher=["--standalone", "--max-restarts=1", "--monitor-interval=0.5"],
                env={"FSDP_EKS_TEST_KILL_IN_SAVE_AT_STEP": str(STEPS)}).check()
    assert f"rank 1 dies while saving step {STEPS}" in run.output
    assert f"resumed from {ckpt}/step_{N:08d}" in run.output
    assert_losses_close(run.losses(), reference.losses(), BITWISE_RTOL, "killed in save")
    assert [s for s, _ in complete_checkpoints(ckpt)] == [N, STEPS]
    assert sorted(p.name for p in ckpt.iterdir()) == [f"step_{N:08d}", f"step_{STEPS:08d}"]


def test_only_complete_checkpoints_count(tmp_path):
    """Checked against the save protocol: a checkpoint counts only under its final name and
    with its COMPLETE marker; a `.tmp` directory or a marker-less one is never resumed."""
    for name, marker in [("step_00000002", True), ("step_00000004", True),
                         (".step_00000006.tmp", True), ("step_00000008", False),
                         ("other", True)]:
        (tmp_path / name).mkdir()
        if marker:
            (tmp_path / name / COMPLETE_MARKER).write_text("{}")
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 4]
    assert complete_checkpoints(tmp_path / "missing") == []
