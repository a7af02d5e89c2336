"""The Prometheus endpoint of a real training run, scraped over HTTP while it trains."""

from __future__ import annotations

import math
import re
import subprocess
import time
import urllib.request

import pytest

from tests.training.conftest import (
    REPO,
    TINY_FLAGS,
    Run,
    free_port,
    records_of,
    start,
    torchrun_cmd,
)
from training import metric_names, prometheus

pytestmark = pytest.mark.timeout(180)


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_the_registry_serves_the_declared_names_and_types():
    """Checked against the exposition text prometheus_client generates for the registry: its
    names and ``# TYPE`` lines are exactly ``metric_names.SERVED``, what the dashboard and the
    alert rules are written against."""
    from prometheus_client import generate_latest

    metrics = prometheus.TrainingMetrics(port=0)
    try:
        text = generate_latest(metrics.registry).decode()
    finally:
        metrics.close()
    served = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))
    # prometheus_client adds a counter's creation time as a gauge of its own: not ours.
    served = {name: kind for name, kind in served.items() if not name.endswith("_created")}
    assert served == metric_names.SERVED


def test_the_readme_names_every_served_metric():
    """training/README.md's list of the contract is complete and names nothing else."""
    section = (REPO / "training" / "README.md").read_text().split("## Prometheus metrics", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"`(fsdp_\w+)", section)) == set(metric_names.SERVED)


def test_endpoint_serves_moving_step_counter(tmp_path, tiny_cache):
    """Checked against a real HTTP scrape of a 2-rank CPU run with --metrics-port: every
    contract metric is served by local rank 0, and the step gauge, the step counter and the
    last-step timestamp move between two scrapes while the loss is a finite positive number;
    after an evaluation the validation loss is too, and its perplexity is exp of it; the node
    check's gauges hold the figures of its record in the metrics file."""
    port = free_port()
    cmd = torchrun_cmd(2) + [*TINY_FLAGS, "--max-steps", "12", "--batch-size", "4",
                             "--cache-dir", str(tiny_cache), "--metrics-port", str(port),
                             "--checkpoint-dir", str(tmp_path / "ckpt"),
                             "--checkpoint-every", "2", "--eval-every", "2",
                             "--metrics-file", str(tmp_path / "metrics.jsonl")]
    proc = start(cmd, FSDP_EKS_TEST_STEP_DELAY_S="0.4")
    try:
        first = _wait_for(port, proc, lambda m: m.get("fsdp_train_step", 0) >= 2)
        second = _wait_for(port, proc, lambda m: m["fsdp_train_step"] >= first["fsdp_train_step"]
                           + 2)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    Run(proc.returncode, out, tmp_path).check()
    served = {name.split("{")[0] for name in first}
    assert set(metric_names.SERVED) <= served, sorted(set(metric_names.SERVED) - served)
    assert second["fsdp_train_steps_total"] > first["fsdp_train_steps_total"]
    assert (second["fsdp_train_last_step_timestamp_seconds"]
            > first["fsdp_train_last_step_timestamp_seconds"])
    assert 0 < second["fsdp_train_loss"] < 20
    assert second["fsdp_train_tokens_per_second"] > 0
    assert second["fsdp_train_tokens_per_second_per_gpu"] == pytest.approx(
        second["fsdp_train_tokens_per_second"] / 2)
    assert second["fsdp_train_mfu_ratio"] == 0  # CPU: no peak, reported as 0
    assert second["fsdp_train_last_checkpoint_timestamp_seconds"] > time.time() - 120
    # --eval-every 2: an evaluation has run by step 4, after which the gauges hold its numbers
    assert 0 < second["fsdp_train_eval_loss"] < 20
    assert second["fsdp_train_eval_perplexity"] == pytest.approx(
        math.exp(second["fsdp_train_eval_loss"]), rel=1e-9)
    # The node check at the start: its figures, as its record in the metrics file has them.
    (check,) = [r for r in records_of(tmp_path / "metrics.jsonl")
                if "node_check/passed" in r]
    for row in check["node_check/bandwidth"]:
        key = (f'{metric_names.NODE_CHECK_BUSBW}{{collective="{row["collective"]}",scope="job",'
               f'unit="{row["unit"]}"}}')
        assert second[key] == pytest.approx(row["busbw_gbs"]), key
    (storage,) = [r for r in check["node_check/results"] if r["check"] == "checkpoint dir"]
    assert second[f'{metric_names.NODE_CHECK_STORAGE}{{direction="write"}}'] == pytest.approx(
        storage["values"]["write_mbs"])
    assert second[metric_names.NODE_CHECK_SECONDS] == pytest.approx(check["node_check/seconds"])


def _wait_for(port: int, proc: subprocess.Popen, ready, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"run ended before the condition:\n{proc.stdout.read()[-3000:]}"
        try:
            metrics = _scrape(port)
            if ready(metrics):
                return metrics
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail("the metrics endpoint never reached the expected state")


def test_a_port_another_process_listens_on_is_refused_at_the_start(tmp_path):
    """Checked against a socket listening on the port here (another exporter on the node):
    the run ends with one error naming --metrics-port and the system's reason before the data
    is read (the dataset named does not exist, and that is not what is reported), and a
    server started on it anyway, after the check, is the same error (before: an OSError
    traceback once the model was loaded and the data packed)."""
    import socket

    from tests.training.conftest import finetune_in_one_process
    from training.errors import UserError

    port = free_port()
    with socket.socket() as other:
        other.bind(("0.0.0.0", port))
        other.listen()
        out = finetune_in_one_process(tmp_path / "cache", "--metrics-port", str(port),
                                      "--dataset", str(tmp_path / "missing.jsonl"))
        with pytest.raises(UserError, match=f"--metrics-port {port}: cannot serve on it"):
            prometheus.TrainingMetrics(port)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    [error] = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert (f"--metrics-port {port}: cannot serve on it on this node (Address already in use)"
            in error)
