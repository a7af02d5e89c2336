"""Shared fixtures: every stack file of the repository, run once per session under mocks, and
one real etcd, started with the command line the stack's etcd Deployment runs."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from components.rendezvous import CLIENT_PORT, PEER_PORT, etcd_command
from tests.harness import (
    STACKS,
    Recording,
    free_port,
    require_tool,
    run_program,
    stack_config,
)


@pytest.fixture(scope="session", params=STACKS)
def stack(request) -> str:
    """The name of each ``Pulumi.<stack>.yaml`` in the repository."""
    return request.param


@functools.cache
def recording_of(stack: str) -> Recording:
    """The whole program run under mocks for ``stack`` (cached: runs once per stack)."""
    return run_program(stack_config(stack), stack)


@pytest.fixture(scope="session")
def recording(stack: str) -> Recording:
    """The whole program run under mocks for each stack file."""
    return recording_of(stack)


def local_etcd_command(binary: str, data_dir: str, client: int, peer: int) -> list[str]:
    """The etcd Deployment's command with loopback addresses, free ports and a temporary data
    directory; every other flag exactly as the pod runs it."""
    command = [binary]
    for arg in etcd_command("training")[1:]:
        arg = arg.replace("0.0.0.0", "127.0.0.1").replace("etcd.training.svc", "127.0.0.1")
        arg = arg.replace(f":{CLIENT_PORT}", f":{client}").replace(f":{PEER_PORT}", f":{peer}")
        if arg.startswith("--data-dir="):
            arg = f"--data-dir={data_dir}"
        command.append(arg)
    return command


@pytest.fixture(scope="session")
def etcd(tmp_path_factory) -> Iterator[str]:
    """A real etcd (Debian's ``etcd-server``, which ``.ci/run`` installs) running our
    Deployment's command on loopback; yields its client endpoint ``127.0.0.1:<port>``. The infra
    tests probe it as the kubelet and python-etcd do, the training tests rendezvous through it."""
    binary = require_tool("etcd", "apt-get install etcd-server (.ci/run does)")
    data = tmp_path_factory.mktemp("etcd-data")
    client, peer = free_port(), free_port()
    log_path = data.parent / "etcd.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(local_etcd_command(binary, str(data), client, peer), stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            _wait_for_health(client, proc, log_path)
            yield f"127.0.0.1:{client}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_for_health(port: int, proc: subprocess.Popen, log: os.PathLike) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"etcd exited with {proc.returncode}: {open(log).read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"etcd did not answer /health on port {port} within 30 s")


def _fresh_state_after_fork() -> None:
    """mutmut (docs/testing.md) runs each mutant in a fork of the process that ran the clean
    tests. The child must not reuse what the parent computed with the unmutated code (the cached
    program runs, the training package's cached parser), and the parent's asyncio loop keeps a
    thread pool whose threads a forked child does not have: a Pulumi mock run would wait on it
    forever. So every functools cache of ours is cleared and the child gets a loop of its own."""
    import asyncio

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("components", "training", "tests"):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
    asyncio.set_event_loop(asyncio.new_event_loop())


if "MUTANT_UNDER_TEST" in os.environ:  # set by mutmut only
    os.register_at_fork(after_in_child=_fresh_state_after_fork)
