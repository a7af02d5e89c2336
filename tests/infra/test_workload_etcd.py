"""Our etcd command line, run for real: it serves /health (the probes) and the v2 API (torchrun).

Checked against a real etcd binary (Debian's ``etcd-server``, which ``.ci/run`` installs) and the
``python-etcd`` client that torch's ``etcd`` / ``etcd-v2`` rendezvous backends use. Only the
addresses are changed (loopback, free ports, a temporary data directory); every other flag is
exactly what the Deployment runs. (Debian's etcd is 3.4, where v2 is on by default: that
the flag is set and the image is 3.5 is asserted on the Deployment in test_workload.py.)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from components.rendezvous import CLIENT_PORT, PEER_PORT, etcd_command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_command(binary: str, data_dir: str, client: int, peer: int) -> list[str]:
    """The Deployment's command with loopback addresses, free ports and a temporary data dir."""
    command = [binary]
    for arg in etcd_command("training")[1:]:
        arg = arg.replace("0.0.0.0", "127.0.0.1").replace("etcd.training.svc", "127.0.0.1")
        arg = arg.replace(f":{CLIENT_PORT}", f":{client}").replace(f":{PEER_PORT}", f":{peer}")
        if arg.startswith("--data-dir="):
            arg = f"--data-dir={data_dir}"
        command.append(arg)
    return command


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    binary = shutil.which("etcd")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("etcd is not installed; .ci/run installs etcd-server")
        pytest.skip("etcd not installed (apt-get install etcd-server)")
    data = tmp_path_factory.mktemp("etcd-data")
    client, peer = free_port(), free_port()
    log = (data.parent / "etcd.log").open("w")
    proc = subprocess.Popen(local_command(binary, str(data), client, peer), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"etcd exited with {proc.returncode}: {(data.parent / 'etcd.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("etcd did not answer /health within 30 s")
        yield client
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_health_endpoint_answers_as_the_probes_expect(etcd_server: int):
    """Checked against the real server: the probes' GET /health returns 200 and healthy."""
    with urllib.request.urlopen(f"http://127.0.0.1:{etcd_server}/health", timeout=5) as r:
        assert r.status == 200
        assert b'"health":"true"' in r.read().replace(b" ", b"")


def test_v2_api_serves_python_etcd(etcd_server: int):
    """Checked with python-etcd, the client torch's etcd rendezvous uses: the v2 keyspace works."""
    import etcd

    client = etcd.Client(host="127.0.0.1", port=etcd_server, protocol="http")
    client.write("/torchelastic/p2p/run_test/state", "joinable", ttl=60)
    assert client.read("/torchelastic/p2p/run_test/state").value == "joinable"
    # Compare-and-swap, which the rendezvous barrier relies on.
    client.test_and_set("/torchelastic/p2p/run_test/state", "frozen", "joinable")
    assert client.read("/torchelastic/p2p/run_test/state").value == "frozen"
