"""Our etcd command line, run for real: it serves /health (the probes) and the v2 API (torchrun).

Checked against a real etcd binary (Debian's ``etcd-server``, which ``.ci/run`` installs) and the
``python-etcd`` client that torch's ``etcd`` / ``etcd-v2`` rendezvous backends use. Only the
addresses are changed (loopback, free ports, a temporary data directory); every other flag is
exactly what the Deployment runs. (Debian's etcd is 3.4, where v2 is on by default: that
the flag is set and the image is 3.5 is asserted on the Deployment in test_workload.py.)
"""

from __future__ import annotations

import urllib.request

# The server: tests/conftest.py's ``etcd`` fixture, which runs the Deployment's command.


def test_health_endpoint_answers_as_the_probes_expect(etcd: str):
    """Checked against the real server: the probes' GET /health returns 200 and healthy."""
    with urllib.request.urlopen(f"http://{etcd}/health", timeout=5) as r:
        assert r.status == 200
        assert b'"health":"true"' in r.read().replace(b" ", b"")


def test_v2_api_serves_python_etcd(etcd: str):
    """Checked with python-etcd, the client torch's etcd rendezvous uses: the v2 keyspace works."""
    import etcd as python_etcd

    host, port = etcd.split(":")
    client = python_etcd.Client(host=host, port=int(port), protocol="http")
    client.write("/torchelastic/p2p/run_test/state", "joinable", ttl=60)
    assert client.read("/torchelastic/p2p/run_test/state").value == "joinable"
    # Compare-and-swap, which the rendezvous barrier relies on.
    client.test_and_set("/torchelastic/p2p/run_test/state", "frozen", "joinable")
    assert client.read("/torchelastic/p2p/run_test/state").value == "frozen"
