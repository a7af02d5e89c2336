"""A node whose own hardware fails the node check taints itself (training/quarantine.py): the
real check's failure path on CPU (a world of one over gloo, EFA devices asked for in an empty
device tree) against a fake Kubernetes API server on 127.0.0.1 that speaks HTTPS with a
certificate made here, and records each request's method, path, bearer token, content type and
body.

Checked against: the Kubernetes API's node path (``/api/v1/nodes/<name>``) and JSON patch
content type (``application/json-patch+json``), RFC 6902 (``test``, ``add``), the pod's
service-account files (``token``, ``ca.crt`` under /var/run/secrets/kubernetes.io/serviceaccount).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from tests.training.conftest import REPO, TINY_FLAGS, child_env, steps_of, torchrun_cmd
from training import faults
from training import node_check as nc
from training import quarantine
from training.config import parse_args
from training.dist import init_distributed

pytestmark = pytest.mark.timeout(240)

NODE = "ip-10-0-1-23.ec2.internal"
TOKEN = "eyJ-the-pods-token"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@dataclass
class FakeApi:
    """The node, the requests seen, and how to answer the next PATCHes (status codes)."""

    node: dict
    requests: list[dict] = field(default_factory=list)
    patch_answers: list[int] = field(default_factory=list)
    port: int = 0


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            api.requests.append({"method": self.command, "path": self.path, "body": body,
                                 "authorization": self.headers.get("Authorization"),
                                 "content_type": self.headers.get("Content-Type")})

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802  http.server's name
            self._record()
            self._answer(200, api.node)

        def do_PATCH(self) -> None:  # noqa: N802
            self._record()
            status = api.patch_answers.pop(0) if api.patch_answers else 200
            if status != 200:
                self._answer(status, {"kind": "Status", "message": f"refused with {status}"})
                return
            for op in api.requests[-1]["body"]:
                if op["op"] == "add" and op["path"] == "/spec/taints":
                    api.node["spec"]["taints"] = op["value"]
            self._answer(200, api.node)

        def log_message(self, *args) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the pod's ``ca.crt``) and its key."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "ca.crt", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def api(certificate, tmp_path, monkeypatch) -> Iterator[FakeApi]:
    """The fake API server, and this process set up as a pod on ``NODE``: the token and CA in
    a service-account directory, ``NODE_NAME`` and the service's host and port."""
    cert, key = certificate
    fake = FakeApi(node={"metadata": {"name": NODE, "resourceVersion": "4711"},
                         "spec": {"taints": [dict(GPU_TAINT)]}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    fake.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(TOKEN + "\n")
    (account / "ca.crt").write_bytes(cert.read_bytes())
    monkeypatch.setattr(quarantine, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("NODE_NAME", NODE)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(fake.port))
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def run_failing_check(tmp_path: Path, *flags: str) -> nc.NodeCheckFailed:
    """The real node check in a world of one, with no EFA device in its device tree; returns
    the failure it raised."""
    env = init_distributed(timeout_s=30)
    try:
        cfg = parse_args(["--model", "tiny", "--metrics-file", str(tmp_path / "m.jsonl"), *flags])
        probe = nc.Probe(dev=tmp_path / "dev", shm=tmp_path, fi_info=None, nvml=None)
        with pytest.raises(nc.NodeCheckFailed) as failed:
            nc.check_job(cfg, env, probe)
        return failed.value
    finally:
        dist.destroy_process_group()


def test_a_node_missing_its_efa_devices_taints_itself(api, world_of_one, tmp_path, caplog):
    """The failing pod reads its node, then adds the quarantine taint beside the node's other
    taints, only if the node is still the version it read; with its own bearer token, over
    TLS verified by the pod's CA; and the check still fails with its own message."""
    caplog.set_level(logging.WARNING, logger="training.quarantine")
    failure = run_failing_check(tmp_path, "--node-check-efa", "2")
    assert "efa devices: 0 of 2" in str(failure)
    get, patch = api.requests
    assert (get["method"], get["path"]) == ("GET", f"/api/v1/nodes/{NODE}")
    assert (patch["method"], patch["path"]) == ("PATCH", f"/api/v1/nodes/{NODE}")
    assert {get["authorization"], patch["authorization"]} == {f"Bearer {TOKEN}"}
    assert patch["content_type"] == "application/json-patch+json"
    assert patch["body"] == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "4711"},
        {"op": "add", "path": "/spec/taints", "value": [
            GPU_TAINT, {"key": "fsdp-eks/quarantine", "value": "node-check-failed", "effect": "NoExecute"}]},
    ]
    assert f"quarantined node {NODE}" in caplog.text and "efa devices: 0 of 2" in caplog.text


def test_a_node_without_taints_gets_the_list_written(api):
    api.node["spec"] = {}
    assert quarantine.quarantine_own_node([nc.Result(NODE, "xid", False, "Xid 79 on GPU 3")])
    [_, patch] = api.requests
    assert patch["body"][1]["value"] == [
        {"key": "fsdp-eks/quarantine", "value": "node-check-failed", "effect": "NoExecute"}]


def test_a_failure_a_new_node_would_not_fix_leaves_the_node(api, world_of_one, tmp_path):
    """``/dev/shm`` too small is the pod's configuration, not the node's hardware."""
    failure = run_failing_check(tmp_path, "--node-check-min-shm-gib", "1000000")
    assert "/dev/shm" in str(failure)
    assert api.requests == []


@pytest.mark.parametrize("check", ["gpus", "gpu 3 health", "xid", "efa devices"])
def test_each_hardware_row_quarantines(check):
    assert quarantine.faulty_hardware([nc.Result(NODE, check, False, "x")])


class XidNvml(faults.FakeNvml):
    """NVML that reports one critical Xid event (79: the GPU fell off the bus) during the check."""

    def __init__(self, gpus):
        super().__init__(gpus)
        self.pending = [SimpleNamespace(eventData=79)]

    def nvmlEventSetWait_v2(self, events, timeout_ms):
        if self.pending:
            return self.pending.pop()
        return super().nvmlEventSetWait_v2(events, timeout_ms)


def failing_hardware_rows() -> dict[str, nc.Result]:
    """Each hardware check of node_check failing, produced by its own function (so a renamed
    row cannot slip past the quarantine's list of row names)."""
    xid = nc.XidWatch(XidNvml([faults.HEALTHY_H100]), 1)
    return {
        "gpu count": nc.check_gpu_count(NODE, 8, 7),
        "gpu health": nc.check_gpu_health(NODE, faults.FakeNvml([{**faults.HEALTHY_H100,
                                                                  "ecc": 2}]), 1)[0],
        "xid": xid.result(NODE),
        "efa devices": nc.check_efa(NODE, 32, ["uverbs0"], None)[0],
    }


@pytest.mark.parametrize("kind", ["gpu count", "gpu health", "xid", "efa devices"])
def test_each_failing_hardware_check_quarantines_as_node_check_names_it(kind):
    row = failing_hardware_rows()[kind]
    assert row.ok is False, row
    assert quarantine.faulty_hardware([row]) == [row]


@pytest.mark.parametrize("check, ok", [("gpus", True), ("gpu 3 health", None), ("ulimit -l", False),
                                       ("libfabric efa", False), ("/dev/shm", False),
                                       ("checkpoint dir", False), ("node checks", False)])
def test_other_rows_do_not(check, ok):
    assert not quarantine.faulty_hardware([nc.Result(NODE, check, ok, "x")])


def test_an_already_quarantined_node_is_not_patched_again(api):
    api.node["spec"]["taints"].append({"key": "fsdp-eks/quarantine", "value": "xid", "effect": "NoExecute"})
    assert quarantine.quarantine_own_node([nc.Result(NODE, "gpus", False, "7 of 8 GPUs")])
    assert [r["method"] for r in api.requests] == ["GET"]


def test_a_node_changed_between_read_and_patch_is_read_again(api):
    """A failed ``test`` (422) or a conflict (409): read the node again and patch that."""
    api.patch_answers = [422, 409]
    assert quarantine.quarantine_own_node([nc.Result(NODE, "gpus", False, "7 of 8 GPUs")])
    assert [r["method"] for r in api.requests] == ["GET", "PATCH"] * 3


def test_a_refused_patch_is_logged_and_the_check_still_fails_with_its_own_message(
        api, world_of_one, tmp_path, caplog):
    """The admission policy or RBAC says no (403): the log says so with the command that does it
    by hand; the check's failure is unchanged."""
    api.patch_answers = [403]
    caplog.set_level(logging.WARNING, logger="training.quarantine")
    failure = run_failing_check(tmp_path, "--node-check-efa", "2")
    assert "efa devices: 0 of 2" in str(failure)
    assert [r["method"] for r in api.requests] == ["GET", "PATCH"]
    assert "could not quarantine node" in caplog.text and "403 refused with 403" in caplog.text
    assert f"kubectl taint node {NODE} fsdp-eks/quarantine=node-check-failed:NoExecute" in caplog.text


def test_an_untrusted_server_is_not_sent_the_patch(api, tmp_path, caplog):
    """A server whose certificate the pod's CA did not sign gets no PATCH (the GET fails TLS)."""
    other = tmp_path / "other.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(tmp_path / "k.pem"), "-out", str(other), "-subj", "/CN=other"],
                   check=True, capture_output=True)
    (quarantine.SERVICE_ACCOUNT_DIR / "ca.crt").write_bytes(other.read_bytes())
    caplog.set_level(logging.WARNING, logger="training.quarantine")
    assert not quarantine.quarantine_own_node([nc.Result(NODE, "gpus", False, "7 of 8 GPUs")])
    assert api.requests == []
    assert "could not quarantine node" in caplog.text


def test_outside_kubernetes_nothing_is_sent_and_it_says_so_once(world_of_one, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(quarantine, "SERVICE_ACCOUNT_DIR", tmp_path / "none")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    caplog.set_level(logging.WARNING, logger="training.quarantine")
    failure = run_failing_check(tmp_path, "--node-check-efa", "2")
    assert "efa devices: 0 of 2" in str(failure)
    said = [r for r in caplog.records if r.name == "training.quarantine"]
    assert len(said) == 1 and "not quarantined" in said[0].getMessage()


def test_an_answer_it_cannot_read_is_logged_not_raised(api, caplog):
    """Whatever goes wrong in the request, the caller's own failure is the one that counts."""
    api.node = {"kind": "Status"}
    caplog.set_level(logging.WARNING, logger="training.quarantine")
    assert not quarantine.quarantine_own_node([nc.Result(NODE, "gpus", False, "7 of 8 GPUs")])
    assert "could not quarantine node" in caplog.text


def test_a_gpu_fault_mid_run_quarantines_the_node_at_the_restart(api, tmp_path, tiny_cache):
    """Issue: a GPU that takes an uncorrectable ECC error during the run leaves without a person.
    Real torchrun, 2 ranks, restarts allowed, on a fake node (training/faults.py: its GPU's NVML
    readings in a file, its pod's service account beside it) whose GPU 0 is healthy at the
    start: the first start's node check passes and the run saves step N; in step N+1 the GPU
    takes the error (its volatile ECC counter stays up, as the driver keeps it) and rank 0
    fails as CUDA fails it; torchrun restarts the workers, the restart's node check reads the
    counter, taints this node through the fake API server and fails with its one line before
    any step on the faulted GPU."""
    n = 2
    (tmp_path / "gpus.json").write_text(json.dumps([faults.HEALTHY_H100]))
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    cmd = torchrun_cmd(2, ["--standalone", "--max-restarts=1", "--monitor-interval=0.5"]) + [
        *TINY_FLAGS, "--cache-dir", str(tiny_cache), "--batch-size", "4",
        "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(n), "--metrics-file", str(metrics)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=200,
                          env=child_env(**{faults.FAKE_NODE_ENV: str(tmp_path),
                                           faults.GPU_FAULT_ENV: str(n + 1)}))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-4000:]
    assert f"GPU 0 takes an uncorrectable ECC error in step {n + 1}" in out
    assert faults.CUDA_ECC_ERROR in out
    assert re.findall(r"node check: (PASSED|FAILED)", out) == ["PASSED", "FAILED"], out[-4000:]
    failure = (f"node check failed before training: {NODE}: gpu 0 health: 1 uncorrectable ECC "
               "errors (--no-node-check skips the check)")
    said = [line for line in out.splitlines() if "node check failed" in line]
    assert len(said) == 1 and said[0].endswith(failure), "\n".join(said)
    get, patch = api.requests
    assert (get["method"], patch["method"]) == ("GET", "PATCH")
    assert patch["body"][1]["value"][-1] == {"key": "fsdp-eks/quarantine", "value": "node-check-failed",
                                             "effect": "NoExecute"}
    assert max(steps_of(metrics)) == n
