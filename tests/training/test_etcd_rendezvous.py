"""torchrun agents rendezvous through a real etcd (Debian's etcd-server, v2 API on), the way
the PyTorchJob's pods do: one agent per "node", one process each."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from tests.training.conftest import Run, start, two_agents

pytestmark = pytest.mark.timeout(300)


def _two_agents(tmp_path, tiny_cache, run_id: str, launcher: list[str], env: dict) -> list[Run]:
    """A 3-step tiny run of one process per agent."""
    return two_agents(tmp_path, run_id, launcher, "--max-steps", "3", "--batch-size", "4",
                      "--cache-dir", str(tiny_cache), env=env)


def _assert_one_job_of_two(runs: list[Run]) -> None:
    leaders = [r for r in runs if r.steps()]
    assert len(leaders) == 1, "exactly one agent hosts global rank 0"
    assert sorted(leaders[0].steps()) == [1, 2, 3]
    assert '"run/gpus": 2, "run/nodes": 2' in leaders[0].output


def test_two_runs_rendezvous_through_etcd(etcd, tmp_path, tiny_cache):
    """Checked against a real etcd: two agents with --rdzv-backend etcd and --nnodes 2 find
    each other and finish a 3-step run as one world of 2; then a second run with a new id on
    the same etcd, configured the way the Training Operator does it (PET_* environment
    variables, no --nnodes flag), finishes too."""
    flags = ["--nnodes=2", "--rdzv-backend=etcd", f"--rdzv-endpoint={etcd}",
             "--rdzv-id=etcd-run-1"]
    _assert_one_job_of_two(_two_agents(tmp_path, tiny_cache, "run1", flags, {}))

    operator_env = {"PET_NNODES": "2", "PET_RDZV_BACKEND": "etcd", "PET_RDZV_ENDPOINT": etcd,
                    "PET_RDZV_ID": "etcd-run-2"}
    _assert_one_job_of_two(_two_agents(tmp_path, tiny_cache, "run2", [], operator_env))


def test_etcd_v2_backend(etcd, tmp_path, tiny_cache):
    """Checked against a real etcd: the other backend that speaks etcd's v2 API, etcd-v2 (the
    dynamic rendezvous on an etcd store), also forms one world of 2 from two agents."""
    operator_env = {"PET_NNODES": "2", "PET_RDZV_BACKEND": "etcd-v2", "PET_RDZV_ENDPOINT": etcd,
                    "PET_RDZV_ID": "etcd-v2-run"}
    _assert_one_job_of_two(_two_agents(tmp_path, tiny_cache, "v2", [], operator_env))


def _torchrun_once(etcd: str, backend: str, run_id: str, script) -> tuple[int, str]:
    """One single-process torchrun of ``script`` rendezvousing under ``run_id``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
           f"--rdzv-backend={backend}", f"--rdzv-endpoint={etcd}", f"--rdzv-id={run_id}", str(script)]
    proc = start(cmd)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out


@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_a_finished_run_id_cannot_rendezvous_again(etcd, tmp_path, backend):
    """Why every node check and every re-run gets its own rendezvous id (components/training_job.py):
    checked against a real etcd, a run that ended closes its id (torchrun's ``launch_agent``
    shuts the rendezvous down in ``finally``), so the same command typed again with the same id
    fails with RendezvousClosedError, while a new id on the same etcd runs."""
    script = tmp_path / "noop.py"
    script.write_text("print('worker ran')\n")
    first = _torchrun_once(etcd, backend, f"{backend}-same", script)
    assert first[0] == 0 and "worker ran" in first[1], first[1]
    again = _torchrun_once(etcd, backend, f"{backend}-same", script)
    assert again[0] != 0 and "RendezvousClosedError" in again[1], again[1]
    fresh = _torchrun_once(etcd, backend, f"{backend}-same-0101000000", script)
    assert fresh[0] == 0 and "worker ran" in fresh[1], fresh[1]


@pytest.mark.parametrize("backend", ["etcd", "etcd-v2"])
def test_a_run_ended_by_sigterm_leaves_its_id_open(etcd, tmp_path, backend):
    """Why a deleted job may be created again under its own name (``job_delete_command``, then the
    next ``pulumi up``): checked against a real etcd, torchrun ended by SIGTERM (what Kubernetes
    sends a deleted pod) skips the rendezvous shutdown (``SignalException``), so a new run under
    the same id rendezvouses and runs."""
    started = tmp_path / "started"
    script = tmp_path / "wait.py"
    script.write_text(f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(600)\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
           f"--rdzv-backend={backend}", f"--rdzv-endpoint={etcd}", f"--rdzv-id={backend}-stopped", str(script)]
    proc = start(cmd)
    try:
        for _ in range(2400):  # the worker started: the rendezvous is complete
            if started.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert started.exists(), proc.communicate(timeout=30)[0] if proc.poll() is not None else "no start"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out
    done = tmp_path / "noop.py"
    done.write_text("print('worker ran')\n")
    again = _torchrun_once(etcd, backend, f"{backend}-stopped", done)
    assert again[0] == 0 and "worker ran" in again[1], again[1]
