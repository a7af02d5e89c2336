"""The node check as the stack runs it: its thresholds on the job's command line, the one-off
check job of the stack output ``node_check_command``, and that command run against stand-ins
for ``pulumi`` and ``kubectl``.

Checked against: the published bus bandwidths the hardware rows cite (NVIDIA/nccl#527 for the
A100 / 400 Gbit/s EFA instances, NVIDIA's 480 GB/s NVLink 4 figure, the EKS maintainers' p5
NCCL test in aws/aws-k8s-tester#503) at the stated margin of one half; the pod's own devices and
/dev/shm volume; the Training Operator v1.9.4 PyTorchJob CRD; the training package's parser.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from components.planning.hardware import PROFILES
from components.settings import JobSettings
from components.stack import Export
from components.cluster_autoscaler import QUARANTINE_TAINT_KEY
from components.training_job import (
    MAX_NAME,
    NODE_CHECK_POLL_S,
    pod_monitor_manifest,
    pytorchjob_manifest,
    training_command,
)
from tests.harness import Recording, container, job_of, job_settings, tolerates, training_flags, worker
from tests.infra.test_workload import crd_schema, undeclared_keys
from training.config import build_parser, config_from_namespace

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp-eks-p5/training:0123@sha256:" + "b" * 64
PUBLISHED = {"p4de": {"node": 230.8, "efa": 57.2}, "p5": {"node": 480.0, "efa": 125.0}}
"""GB/s, from the sources the hardware table names (components/planning/hardware.py NODE_CHECK_SOURCES);
the floors are rounded to 0.1 GB/s."""
MARGIN = 0.5


def render(job: JobSettings = JobSettings(), profile: str = "p5", check_only: bool = False) -> dict:
    return pytorchjob_manifest(job, PROFILES[profile], image=IMAGE, namespace="training",
                               rdzv_host="etcd.training.svc", hf_secret="hf-token",
                               shared_claim="fsx-claim", check_only=check_only)


def same_flags(check: dict, train: dict) -> bool:
    """The check's flags are the job's, its own run directory in place of the run's."""
    names = check["metadata"]["name"], train["metadata"]["name"]
    return [a.replace(*names) for a in training_flags(container(check)["command"])] == training_flags(container(train)["command"])


def parsed(command: list[str]):
    return config_from_namespace(build_parser().parse_args(training_flags(command))).node_check


@pytest.mark.parametrize("profile", ["p4de", "p5"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_thresholds_are_the_profiles_published_figures_at_half(profile, nodes):
    job = render(job_settings(nodes=nodes, min_nodes=nodes, max_nodes=nodes), profile)
    c = container(job)
    check = parsed(c["command"])
    over_all = PUBLISHED[profile]["efa" if nodes > 1 else "node"] * MARGIN
    assert check.node_check_min_busbw_gbs == pytest.approx(over_all, abs=0.06)
    assert check.node_check_min_node_busbw_gbs == pytest.approx(PUBLISHED[profile]["node"] * MARGIN, abs=0.06)
    assert check.node_check_gpus == int(c["resources"]["limits"]["nvidia.com/gpu"])
    assert check.node_check_efa == int(c["resources"]["limits"]["vpc.amazonaws.com/efa"])
    (shm,) = [v for v in worker(job)["template"]["spec"]["volumes"] if v["name"] == "shm"]
    assert f"{check.node_check_min_shm_gib:g}Gi" == shm["emptyDir"]["sizeLimit"]
    assert check.node_check is True and check.node_check_timeout_s == 300


@pytest.mark.parametrize("efa, floor", [(16, 125.0 * MARGIN / 2), (0, 0.0)])
def test_fewer_efa_interfaces_lower_the_floor_and_none_checks_none(efa, floor):
    """Half the p5's 32 interfaces carry half the bandwidth; without EFA NCCL uses sockets, as
    asked, and the figure is reported only."""
    job = dataclasses.replace(JobSettings(), efa_per_node=efa)
    assert parsed(training_command(job, PROFILES["p5"])).node_check_min_busbw_gbs == pytest.approx(floor, abs=0.06)


def test_the_check_job_runs_only_the_check_with_the_jobs_flags():
    train, check = render(), render(check_only=True)
    assert check["metadata"]["name"].startswith("node-check-")
    assert container(check)["command"][:5] == ["python", "-m", "training.launch", "-m",
                                               "training.node_check"]
    assert same_flags(check, train)
    # A failed check fails once: no restart in the pod (torchrun) or of the pod (operator).
    assert check["spec"]["elasticPolicy"]["maxRestarts"] == 0
    assert check["spec"]["runPolicy"]["backoffLimit"] == 0
    assert worker(check)["restartPolicy"] == "Never"
    assert worker(check)["replicas"] == worker(train)["replicas"]
    assert container(check)["resources"] == container(train)["resources"]


def test_the_check_job_validates_against_the_crd_and_is_not_scraped():
    check = render(check_only=True)
    errors = [e.message for e in jsonschema.Draft4Validator(crd_schema()).iter_errors(check)]
    assert not errors, errors
    assert undeclared_keys(check["spec"], crd_schema()["properties"]["spec"], "spec") == []
    selector = pod_monitor_manifest("training")["spec"]["selector"]["matchLabels"]
    labels = worker(check)["template"]["metadata"]["labels"]
    assert not selector.items() <= labels.items(), "the PodMonitor would scrape the check's pods"
    assert selector.items() <= worker(render())["template"]["metadata"]["labels"].items()


def test_only_the_check_pods_stay_a_bounded_time_on_a_node_they_quarantined():
    """The check's pods tolerate the quarantine taint for a bounded time (their table must
    outlive the taint their own failure sets); the training workers do not tolerate it at all
    (they must leave a quarantined node at once)."""
    quarantine = {"key": QUARANTINE_TAINT_KEY, "value": "node-check-failed", "effect": "NoExecute"}
    check, train = worker(render(check_only=True))["template"]["spec"], worker(render())["template"]["spec"]
    [held] = [t for t in check["tolerations"] if t.get("key") == QUARANTINE_TAINT_KEY]
    assert held == {"key": QUARANTINE_TAINT_KEY, "operator": "Exists", "effect": "NoExecute",
                    "tolerationSeconds": held["tolerationSeconds"]}
    assert 0 < held["tolerationSeconds"] <= 10 * NODE_CHECK_POLL_S
    assert not tolerates(train["tolerations"], quarantine)
    assert [t for t in check["tolerations"] if t is not held] == train["tolerations"]


def test_workers_name_their_kubernetes_node():
    env = {e["name"]: e for e in container(render())["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


# --------------------------------------------------------------------------- the stack output
def test_outputs_give_the_check_job_and_its_command(recording: Recording):
    e = recording.exports
    manifest, job = e[Export.NODE_CHECK_MANIFEST], job_of(recording)
    assert manifest["metadata"]["name"].startswith("node-check-")
    assert same_flags(manifest, job)
    assert container(manifest)["image"] == container(job)["image"]
    assert manifest["metadata"]["name"] in e[Export.NODE_CHECK_COMMAND]
    assert not {Export.NODE_CHECK_MANIFEST, Export.NODE_CHECK_COMMAND} & recording.secret_exports


FAKE_KUBECTL = """#!/bin/sh
echo "kubectl $*" >> "$CALLS"
case "$*" in
  *"create -f -"*) cat > "$CREATED" ;;
  *"get pytorchjob"*"status==\\"True\\""*) echo "Created Running Succeeded" ;;
  *"get pytorchjob"*"conditions[-1]"*) echo "$END_STATE" ;;
  *logs*) printf '%s\\n' \\
    'worker-1/pytorch 10:00:01 [rank 8] WARNING a warning from another rank' \\
    'worker-0/pytorch 10:00:02 [rank 0] INFO node check: PASSED in 9.1 s, 16 ranks on 2 node(s)' \\
    'worker-0/pytorch 10:00:02 [rank 0] INFO   all_reduce  root  1,048.576  ...' ;;
esac
"""


def test_the_check_command_creates_waits_prints_rank_0s_table_and_cleans_up(recording: Recording, tmp_path: Path):
    """The exported command run by bash with ``pulumi`` and ``kubectl`` stand-ins on PATH: it
    creates exactly the exported manifest, polls until the job finished, prints rank 0's lines
    (the table) and no other rank's, and deletes the job."""
    e = recording.exports
    manifest = e[Export.NODE_CHECK_MANIFEST]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(f"#!/bin/sh\necho \"$*\" > \"$PULUMI_ARGS\"\ncat <<'EOF'\n"
                                    f"{json.dumps(manifest, indent=2)}\nEOF\n")
    (bin_dir / "kubectl").write_text(FAKE_KUBECTL)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
           "CREATED": str(tmp_path / "created.json"), "PULUMI_ARGS": str(tmp_path / "pulumi_args"),
           "END_STATE": "Succeeded"}
    out = subprocess.run(["bash", "-c", e[Export.NODE_CHECK_COMMAND]], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "pulumi_args").read_text().split() == ["stack", "output", "node_check_manifest", "--json"]
    created = json.loads((tmp_path / "created.json").read_text())
    ns, name, run = manifest["metadata"]["namespace"], manifest["metadata"]["name"], created["metadata"]["name"]
    assert re.fullmatch(rf"{name}-\d{{10}}", run) and len(run) <= MAX_NAME
    assert created == json.loads(json.dumps(manifest).replace(name, run)), "the manifest, under its own name"
    assert "[rank 0] INFO node check: PASSED" in out.stdout and "[rank 8]" not in out.stdout
    assert out.stdout.rstrip().endswith("Succeeded")
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[-1] == f"kubectl -n {ns} delete pytorchjob {run}"
    assert any(c.startswith(f"kubectl -n {ns} logs -l fsdp-eks/run={run} -c pytorch") for c in calls)


def test_the_check_command_fails_when_the_check_failed(recording: Recording, tmp_path: Path):
    """A script that runs the exported command can tell a failed check from a passed one: a job
    that ended Failed gives a non-zero status, after the job was deleted all the same."""
    e = recording.exports
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text("#!/bin/sh\necho '{}'\n")
    (bin_dir / "kubectl").write_text(FAKE_KUBECTL)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
           "CREATED": str(tmp_path / "created.json"), "END_STATE": "Failed"}
    out = subprocess.run(["bash", "-c", e[Export.NODE_CHECK_COMMAND]], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0
    assert out.stdout.rstrip().endswith("Failed")
    assert "delete pytorchjob" in (tmp_path / "calls").read_text()


TAINT_CLOCK_KUBECTL = """#!{python}
import json, os, sys
args = " ".join(sys.argv[1:])
clock = int(open(os.environ["CLOCK"]).read())
ended = int(os.environ["TAINT_AT"]) + int(os.environ["ENDS_AFTER"])
if "create -f -" in args:
    open(os.environ["CREATED"], "w").write(sys.stdin.read())
elif "get pytorchjob" in args:
    print(("Created Running Failed" if clock >= ended else "Created Running") if "status==" in args
          else "Failed" if clock >= ended else "Running")
elif " logs " in f" {{args}} ":
    # The taint manager deletes the pod (and its log) the smallest tolerationSeconds of the
    # pod's tolerations of the taint after it saw the taint, at once without one.
    spec = json.load(open(os.environ["CREATED"]))["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    held = min((t.get("tolerationSeconds", 0) for t in spec.get("tolerations", [])
                if t.get("key") == "{key}" and t.get("effect") == "NoExecute"), default=0)
    if clock < int(os.environ["TAINT_AT"]) + held:
        print("worker-0/pytorch 10:00:02 [rank 0] INFO node check: FAILED in 9.1 s, 16 ranks on 2 node(s)")
"""
CLOCK_SLEEP = """#!/bin/sh
echo $(( $(cat "$CLOCK") + $1 )) > "$CLOCK"
"""


def run_check_command_against_the_taint(recording: Recording, tmp_path: Path,
                                        ends_after: int) -> subprocess.CompletedProcess:
    """The exported command with stand-ins for ``pulumi``, ``kubectl`` and ``sleep`` on one
    clock: rank 0's pod taints its node just after the command's first poll and its job is
    marked failed ``ends_after`` seconds later; ``kubectl logs`` shows the table while the taint
    manager would keep the pod (the rule of ``components.node_quarantine.quarantine_toleration``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(recording.exports[Export.NODE_CHECK_MANIFEST])}\nEOF\n")
    (bin_dir / "kubectl").write_text(TAINT_CLOCK_KUBECTL.format(python=sys.executable, key=QUARANTINE_TAINT_KEY))
    (bin_dir / "sleep").write_text(CLOCK_SLEEP)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "clock").write_text("0")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CLOCK": str(tmp_path / "clock"),
           "CREATED": str(tmp_path / "created.json"), "TAINT_AT": "0", "ENDS_AFTER": str(ends_after)}
    return subprocess.run(["bash", "-c", recording.exports[Export.NODE_CHECK_COMMAND]], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ends_after", [1, NODE_CHECK_POLL_S, 2 * NODE_CHECK_POLL_S])
def test_the_table_of_a_pod_that_quarantined_its_node_is_printed(recording: Recording, tmp_path: Path,
                                                                 ends_after: int):
    """Rank 0's pod failed the check on its own node and tainted it: its processes end and its
    job is marked failed within two polls of the taint, and the command still prints its table
    (before: the pod was deleted at once, and the command printed no table)."""
    out = run_check_command_against_the_taint(recording, tmp_path, ends_after)
    assert "[rank 0] INFO node check: FAILED" in out.stdout, out.stdout + out.stderr
    assert out.returncode != 0 and out.stdout.rstrip().endswith("Failed")

