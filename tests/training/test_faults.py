"""Faults under torchrun with restarts allowed: a worker SIGKILLed mid-run, a worker killed while
writing a checkpoint, the job sent SIGTERM (as Kubernetes ends a pod) or SIGINT (Ctrl-C), a
whole "node" (agent and worker) lost under the etcd rendezvous, and a hung (SIGSTOPped) worker.
Each must end where an uninterrupted run ends, or end within its configured bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.conftest import (
    STEPS,
    TINY_FLAGS,
    Run,
    assert_losses_close,
    records_of,
    steps_of,
    start,
    torchrun_cmd,
    train,
)
from training.checkpoint import COMPLETE_MARKER, complete_checkpoints
from training.termination import exit_status

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
    proc = start(cmd, FSDP_EKS_TEST_STEP_DELAY_S="0.5")
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


def _kill_job(proc: subprocess.Popen) -> None:
    """A failed test's cleanup: torchrun's workers (in sessions of their own, so they outlive a
    SIGKILLed torchrun) and then torchrun."""
    if proc.poll() is None:
        for pid in _workers(proc.pid).values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()


def _send(proc: subprocess.Popen, signum: signal.Signals) -> None:
    """What sends ``signum`` to the job in use: SIGTERM from the kubelet to the container's first
    process, torchrun; SIGINT (Ctrl-C), SIGQUIT (Ctrl-backslash) and SIGHUP (a hang-up) from a
    terminal to its whole foreground process group (torchrun's workers run in sessions of their
    own, so those reach them through torchrun)."""
    if signum == signal.SIGTERM:
        os.kill(proc.pid, signum)
    else:
        os.killpg(proc.pid, signum)


STOP_SIGNALS = pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT],
                                       ids=["SIGTERM-pod-ended", "SIGINT-ctrl-c"])
EVERY_STOP_SIGNAL = pytest.mark.parametrize(
    "signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT],
    ids=["SIGTERM-pod-ended", "SIGINT-ctrl-c", "SIGHUP-hang-up", "SIGQUIT-ctrl-backslash"])


def _assert_one_line_per_process(out: str, signum: signal.Signals) -> None:
    """The launcher's one line and status 128 + the signal; no worker's traceback."""
    status = exit_status(signum)
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-4000:]
    assert f"torchrun: stopped by {signum.name}" in out, out[-4000:]
    assert out.count(f"exit status {status}") == 1, out[-4000:]


@STOP_SIGNALS
def test_a_stop_signal_saves_the_step_and_the_next_start_matches_uninterrupted(
        reference, tmp_path, tiny_cache, signum):
    """Checked against the uninterrupted reference run and README's account of an ended pod and
    of Ctrl-C: the job's launcher (training.launch, torchrun) is sent SIGTERM (as Kubernetes
    ends a pod) or its process group SIGINT (as a terminal's Ctrl-C) after step 2 of a run whose
    only regular checkpoint is the last step's; its workers finish the step in flight, save it,
    and the launcher exits 128 + the signal (143, 130) with one line and no traceback (before:
    torchrun printed a SignalException traceback and exited 1; on SIGINT every worker printed a
    KeyboardInterrupt traceback); the same command started again resumes from that step and
    ends with the reference's losses at every step, the final one included."""
    ckpt = tmp_path / "ckpt"
    metrics = tmp_path / "metrics.jsonl"
    flags = ["--batch-size", "4", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "0"]
    launcher = ["--standalone", "--max-restarts=0", "--monitor-interval=0.5"]
    cmd = torchrun_cmd(2, launcher, via="training.launch") + [
        *TINY_FLAGS, "--cache-dir", str(tiny_cache), *flags, "--metrics-file", str(metrics)]
    proc = start(cmd, own_process_group=True, FSDP_EKS_TEST_STEP_DELAY_S="0.5")
    try:
        _wait_for_step(metrics, 2, [proc], timeout=120)
        _send(proc, signum)
        out, _ = proc.communicate(timeout=120)
    finally:
        _kill_job(proc)
    stopped = max(steps_of(metrics))
    assert proc.returncode == exit_status(signum), out[-4000:]
    _assert_one_line_per_process(out, signum)
    assert 2 <= stopped < STEPS, out[-4000:]
    assert out.count(f"stopped after step {stopped} on {signum.name}") == 1, out[-4000:]
    assert [s for s, _ in complete_checkpoints(ckpt)] == [stopped]
    again = train(tmp_path, *flags, cache=tiny_cache, launcher=launcher).check()
    assert f"resumed from {ckpt}/step_{stopped:08d}" in again.output
    assert_losses_close(again.losses(), reference.losses(), BITWISE_RTOL,
                        f"{signum.name} + restart")
    assert again.losses()[-1] == reference.losses()[-1]


@EVERY_STOP_SIGNAL
def test_a_stop_signal_in_the_setup_ends_every_rank_with_one_line(tmp_path, tiny_cache, signum):
    """Checked against training/termination.py's rule for the setup: the launcher is sent
    SIGTERM (or its process group SIGINT, as Ctrl-C) while both ranks are in the setup, past
    its first collectives (a test hook pauses them there); every worker stops at once, nothing
    is trained or saved, and the launcher exits 128 + the signal with one line and no traceback
    (before: the handler was installed only at the loop, so the workers died by the signal and
    torchrun exited 1 with a traceback; a rank that had installed it while its peer had not
    failed with a gloo connection reset; on SIGINT every worker printed a KeyboardInterrupt
    traceback). SIGHUP and SIGQUIT, which torchrun passes on alike, end the same way (before:
    the default action killed each worker, SIGQUIT with a core dump)."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    cmd = torchrun_cmd(2, ["--standalone", "--max-restarts=0", "--monitor-interval=0.5"],
                       via="training.launch") + [
        *TINY_FLAGS, "--cache-dir", str(tiny_cache), "--checkpoint-dir", str(ckpt),
        "--metrics-file", str(metrics)]
    proc = start(cmd, own_process_group=True, FSDP_EKS_TEST_SETUP_PAUSE_S="120")
    seen: list[str] = []
    try:
        while sum("pauses 120 s in the setup" in line for line in seen) < 2:
            line = proc.stdout.readline()
            assert line, "the run ended before the setup's pause:\n" + "".join(seen[-40:])
            seen.append(line)
        _send(proc, signum)
        out, _ = proc.communicate(timeout=120)
    finally:
        _kill_job(proc)
    out = "".join(seen) + out
    assert proc.returncode == exit_status(signum), out[-4000:]
    _assert_one_line_per_process(out, signum)
    assert out.count(f"stopped on {signum.name} before the first step: nothing to save yet") == 1, (
        out[-4000:])
    assert not steps_of(metrics) and not complete_checkpoints(ckpt)


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_saved_step(tmp_path, tiny_cache):
    """Checked against training/termination.py's rule for one rank signalled (a node reclaimed
    alone): only rank 1's worker is sent SIGINT mid-run; rank 0, never signalled, learns it
    from the step's all-reduce, both stop after the same step, that step's checkpoint is
    complete, and the leader's line names the peer's signal; nothing was trained past it."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    cmd = torchrun_cmd(2, ["--standalone", "--max-restarts=0", "--monitor-interval=0.5"],
                       via="training.launch") + [
        *TINY_FLAGS, "--cache-dir", str(tiny_cache), "--batch-size", "4",
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", "0", "--metrics-file", str(metrics)]
    proc = start(cmd, FSDP_EKS_TEST_STEP_DELAY_S="0.5")
    try:
        _wait_for_step(metrics, 2, [proc], timeout=120)
        os.kill(_workers(proc.pid)[1], signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        _kill_job(proc)
    stopped = max(steps_of(metrics))
    assert 2 <= stopped < STEPS, out[-4000:]
    assert out.count(f"stopped after step {stopped} on SIGINT") == 1, out[-4000:]
    assert [s for s, _ in complete_checkpoints(ckpt)] == [stopped]


def test_an_error_after_the_stop_signal_ends_with_its_status_and_one_line(tmp_path, tiny_cache):
    """Checked against training/termination.py's rule for an error on a rank that was sent the
    signal (a collective cut short by a peer that stopped first): a one-process run is sent
    SIGTERM mid-run and, by a test hook, raises an error at its next step end, before the loop
    reads the signal; the process exits 143 with one line naming the signal and the error, and
    no traceback (without that rule: the error's traceback and status 1)."""
    metrics = tmp_path / "metrics.jsonl"
    cmd = [sys.executable, "-m", "training.finetune", *TINY_FLAGS, "--cache-dir", str(tiny_cache),
           "--metrics-file", str(metrics)]
    proc = start(cmd, FSDP_EKS_TEST_STEP_DELAY_S="0.5", FSDP_EKS_TEST_FAIL_WHEN_SIGNALLED="1")
    try:
        _wait_for_step(metrics, 1, [proc], timeout=120)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == exit_status(signal.SIGTERM), out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert out.count("[rank 0] stopped on SIGTERM (RuntimeError after the signal") == 1, out[-4000:]
    assert max(steps_of(metrics)) < STEPS


def _wait_for_step(metrics: Path, step: int, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while max(steps_of(metrics), default=0) < step:
        for proc in procs:
            assert proc.poll() is None, f"run ended early:\n{proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, f"the run never reached step {step}"
        time.sleep(0.05)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _steps_after(path: Path, line: int) -> list[dict]:
    """The training-step records after the first ``line`` lines (a restarted group's node check
    writes a record of its own before its first step)."""
    return [r for r in records_of(path, skip=line) if "train/step" in r]


LOST_NODE_BOUND_S = 60
"""Kill to first step after resume, on this 2-core machine (measured: README, Resilience)."""


LAST_CALL_S = 30
"""torchrun's etcd rendezvous waits this long past ``--nnodes``' minimum for more nodes
(``last_call_timeout``'s default, torch/distributed/elastic/rendezvous/etcd_rendezvous.py):
the price of going on without a lost node."""


@pytest.mark.parametrize("replaced", [True, False], ids=["replaced", "elastic-without-it"])
def test_lost_node_resumes_from_last_checkpoint_through_etcd(etcd, reference, tmp_path,
                                                            tiny_cache, replaced):
    """Checked against the uninterrupted reference run and a real etcd: two torchrun agents
    (one process each) train together; after step N+1 one whole "node" is lost (its agent and
    worker SIGKILLed: a quarantined node's pod evicted, a node gone). ``replaced``
    (--nnodes 2, min = max nodes): a replacement agent starts, both rendezvous again, resume
    from step N's checkpoint, and the run ends with the reference's losses at every step.
    ``elastic-without-it`` (--nnodes 1:2, as job.minNodes 1 renders): no node comes, and the
    survivor alone resumes from step N's checkpoint (world size 2 -> 1: the data's next rows,
    a warning) and trains to the end. The kill-to-first-resumed-step time is measured and
    bounded."""
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    launcher = ["--nnodes=2" if replaced else "--nnodes=1:2", "--rdzv-backend=etcd",
                f"--rdzv-endpoint={etcd}", f"--rdzv-id=lost-node-{'replaced' if replaced else 'elastic'}",
                "--max-restarts=1", "--monitor-interval=0.5"]
    cmd = torchrun_cmd(1, launcher) + [
        *TINY_FLAGS, "--cache-dir", str(tiny_cache), "--batch-size", "4",
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(N), "--metrics-file", str(metrics)]

    def agent() -> subprocess.Popen:
        return start(cmd, FSDP_EKS_TEST_STEP_DELAY_S="0.5")

    agents = [agent(), agent()]
    try:
        _wait_for_step(metrics, N + 1, agents, timeout=180)
        lost = agents.pop(1)
        victims = [*_workers(lost.pid).values(), lost.pid]
        before, killed = _lines(metrics), time.monotonic()
        for pid in victims:  # the node goes away: its agent and its worker at once
            os.kill(pid, signal.SIGKILL)
        if replaced:
            agents.append(agent())  # the replacement node's pod
        while not _steps_after(metrics, before):
            assert time.monotonic() - killed < 180, "no step after the node was lost"
            time.sleep(0.05)
        restart_s = time.monotonic() - killed
        outputs = [a.communicate(timeout=180)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
    for a, out in zip(agents, outputs):
        assert a.returncode == 0, f"agent failed ({a.returncode}):\n{out[-6000:]}"
    assert any(f"resumed from {ckpt}/step_{N:08d}" in out for out in outputs)
    after = _steps_after(metrics, before)
    assert after[0]["train/step"] == N + 1, "resumed from the last checkpoint, step N"
    assert after[-1]["train/step"] == STEPS, "the run trained to its end"
    print(f"lost node ({'replaced' if replaced else 'elastic'}): {restart_s:.1f} s from the kill "
          "to the first step after resume")
    if replaced:
        run = Run(0, "".join(outputs), tmp_path)
        assert_losses_close(run.losses(), reference.losses(), BITWISE_RTOL, "node lost + replaced")
        assert restart_s < LOST_NODE_BOUND_S, f"restart took {restart_s:.1f} s"
    else:
        assert restart_s < LOST_NODE_BOUND_S + LAST_CALL_S, f"restart took {restart_s:.1f} s"


COLLECTIVE_TIMEOUT_S = 5
SHUTDOWN_GRACE_S = 30
"""torchrun's stop of a failed group: SIGTERM, then SIGKILL after 30 s to what is still there
(a stopped process ignores SIGTERM); LocalElasticAgent._stop_workers uses this default, not
--shutdown-timeout (torch/distributed/elastic/agent/server/local_elastic_agent.py)."""
HANG_MARGIN_S = 15


def test_hung_rank_fails_the_group_within_the_collective_timeout(tmp_path, tiny_cache):
    """Checked against the configured bound, with real processes and gloo: rank 1 is
    SIGSTOPped mid-run (it stops answering but its sockets stay open); rank 0's next
    collective times out after --collective-timeout-s, the worker fails, and torchrun
    (--max-restarts=0) stops the group and exits non-zero within that timeout plus its
    shutdown grace plus a margin, instead of hanging."""
    metrics = tmp_path / "metrics.jsonl"
    cmd = torchrun_cmd(2, ["--standalone", "--max-restarts=0", "--monitor-interval=0.5"]) + [
        *TINY_FLAGS, "--cache-dir", str(tiny_cache), "--batch-size", "4",
        "--collective-timeout-s", str(COLLECTIVE_TIMEOUT_S), "--metrics-file", str(metrics)]
    proc = start(cmd, FSDP_EKS_TEST_STEP_DELAY_S="0.5")
    victim = None
    try:
        _wait_for_step(metrics, 2, [proc], timeout=120)
        victim = _workers(proc.pid)[1]
        os.kill(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        out, _ = proc.communicate(timeout=COLLECTIVE_TIMEOUT_S + SHUTDOWN_GRACE_S + 60)
        ended = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0, "the run cannot succeed with a stopped rank"
    assert max(steps_of(metrics)) < STEPS
    assert "timed out" in out.lower() or "timeout" in out.lower(), out[-4000:]
    print(f"hung rank: torchrun exited {ended:.1f} s after SIGSTOP")
    assert ended <= COLLECTIVE_TIMEOUT_S + SHUTDOWN_GRACE_S + HANG_MARGIN_S, (
        f"{ended:.1f} s from SIGSTOP to exit")
    assert ended >= COLLECTIVE_TIMEOUT_S - 1, "it failed before the timeout: not the hang"


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
