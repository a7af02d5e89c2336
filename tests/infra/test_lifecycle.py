"""The user's days, in the order README's quickstart gives them, over the offline plan and the
rendered objects: ``pulumi up`` (a new cluster and ``cluster.existingClusterName``) -> node check
-> fix a node, node check again -> job -> job ends -> the same job again -> scale to zero ->
``pulumi up`` -> next job -> ``pulumi destroy``.

At each step it asserts what the user relies on: every pod that must reach etcd is admitted by
etcd's NetworkPolicy; every invocation rendezvouses under its own id (torch refuses a closed one
for two hours, tests/training/test_etcd_rendezvous.py); the commands README and the outputs give
restore what they promise (``pulumi up`` refreshes first: Pulumi.yaml); every release waits for
what its pods need. The printed commands run for real in bash, with stand-ins for ``pulumi`` (the
stack outputs) and ``kubectl`` (which records what it is given) on PATH.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from components import versions
from components.observability.alert_delivery import RULES_FILE
from components.stack import Export
from offline.mocks import run_program
from offline.recording import Recording
from tests.harness import (HELM, container, job_of, release, stack_config, training_flags, variant_config, waits_for,
                           worker)
from training import node_check as check_judge
from training.config import build_parser, config_from_namespace

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
SOCKET_LINE = "worker-0:22:28 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"
"""NCCL_DEBUG=INFO's connection line of a fabric that fell back to TCP sockets."""
STAMP_SECONDS = 1.1
"""Between two invocations: their names carry the time to the second."""

KUBECTL = """#!/bin/sh
echo "kubectl $*" >> "$CALLS"
case "$*" in
  *"create -f -"*) n=$(ls "$CREATED" | wc -l); cat > "$CREATED/$n.json" ;;
  *"get pytorchjob"*) echo Succeeded ;;
  *logs*) echo 'worker-0/pytorch [rank 0] INFO node check: PASSED' ;;
esac
"""


def quickstart() -> list[str]:
    """README's quickstart, one command per line (comments and blank lines dropped)."""
    block = README.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].split(" # ", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


class Shell:
    """bash with ``pulumi`` answering ``stack output <name> --json`` from a recording's exports and
    a ``kubectl`` that keeps every object created (``created``) and every call."""

    def __init__(self, tmp_path: Path, recording: Recording):
        self.dir = tmp_path
        (tmp_path / "bin").mkdir(exist_ok=True)
        (tmp_path / "created").mkdir(exist_ok=True)
        (tmp_path / "outputs.json").write_text(json.dumps(recording.exports))
        # `stack output <name>` prints a string as it is, `--json` prints JSON (Pulumi CLI).
        pulumi = ('#!/bin/sh\nexec python3 -c \'import json,sys; v = json.load(open(sys.argv[1]))[sys.argv[4]]; '
                  'print(json.dumps(v) if "--json" in sys.argv or not isinstance(v, str) else v)\' '
                  f'"{tmp_path / "outputs.json"}" "$@"\n')
        (tmp_path / "bin" / "pulumi").write_text(pulumi)
        (tmp_path / "bin" / "kubectl").write_text(KUBECTL)
        for tool in (tmp_path / "bin").iterdir():
            tool.chmod(0o755)

    def run(self, command: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{self.dir / 'bin'}:{os.environ['PATH']}",
               "CALLS": str(self.dir / "calls"), "CREATED": str(self.dir / "created")}
        out = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out

    def created(self) -> list[dict]:
        files = sorted(self.dir.joinpath("created").iterdir(), key=lambda f: int(f.stem))
        return [json.loads(f.read_text()) for f in files]


def rdzv_id(job: dict) -> str:
    return job["spec"]["elasticPolicy"]["rdzvId"]


def admitted_by_etcd(recording: Recording, job: dict) -> bool:
    """Whether etcd's NetworkPolicy admits ``job``'s worker pods to the client port."""
    [policy] = [p for p in recording.of_type(NETWORK_POLICY) if p.inputs["metadata"]["name"] == "etcd"]
    labels = worker(job)["template"]["metadata"]["labels"]
    if policy.inputs["metadata"]["namespace"] != job["metadata"]["namespace"]:
        return False
    return any(all(labels.get(k) == v for k, v in peer["podSelector"]["matchLabels"].items())
               for rule in policy.inputs["spec"]["ingress"] for peer in rule["from"])


def assert_releases_wait_for_what_they_need(recording: Recording) -> None:
    """Every release's dependencies exist in the graph; dcgm-exporter reads the node monitoring
    agent's host engine only where the stack installs the agent, and then waits for it."""
    names = {r.name for r in recording.resources}
    for r in recording.of_type(HELM):
        assert set(r.dependencies) <= names, (r.name, set(r.dependencies) - names)
    dcgm = release(recording, versions.DCGM_EXPORTER)
    agents = [r.name for r in recording.of_type("aws:eks/addon:Addon")
              if r.inputs["addonName"] == NODE_MONITORING_AGENT]
    if "-r" in dcgm.inputs["values"]["arguments"]:
        assert agents and set(agents) <= waits_for(recording, dcgm.name), "the exporter reads a host engine not waited for"


def new_runs(shell: Shell, command: str, before: int) -> list[dict]:
    shell.run(command)
    return shell.created()[before:]


@pytest.mark.parametrize("cluster", ["new", "existing"])
def test_the_users_days(cluster: str, tmp_path: Path):
    sections = {} if cluster == "new" else {"cluster": {"existingClusterName": "research"},
                                            "storage": {"fsx": False, "existingClaimName": "checkpoints"}}
    config = variant_config("p5", **sections)

    # Day 1, `pulumi up`: every `pulumi up` compares with the live state (refresh first).
    commands = quickstart()
    assert yaml.safe_load((REPO / "Pulumi.yaml").read_text()).get("options", {}).get("refresh") == "always", (
        "README's plain `pulumi up` after a manual scale or delete restores only with a refresh first")
    up = run_program(config, f"lifecycle-{cluster}")
    assert_releases_wait_for_what_they_need(up)
    for line in commands:  # every output README evaluates exists
        for name in re.findall(r"pulumi stack output (\w+)", line):
            if name == Export.GPU_SCALE_TO_ZERO_COMMAND and cluster == "existing":
                continue  # its node groups are not ours
            assert name in up.exports, f"README evaluates {name}, which the stack does not export"
    # What the printed commands read with `pulumi stack output --json`: plain, or they would read "[secret]".
    assert not {Export.NODE_CHECK_MANIFEST, Export.JOB_MANIFEST, Export.JOB_RERUN_COMMAND} & up.secret_exports
    shell = Shell(tmp_path, up)
    job = job_of(up)
    assert admitted_by_etcd(up, job), "the training workers must reach etcd"

    # The node check, twice (a node fixed in between): each a new job, own rendezvous id, admitted.
    node_check = f'eval "$(pulumi stack output {Export.NODE_CHECK_COMMAND})"'
    assert node_check in commands
    checks = new_runs(shell, node_check, 0)
    time.sleep(STAMP_SECONDS)
    checks += new_runs(shell, node_check, 1)
    assert len(checks) == 2
    for check in checks:
        assert admitted_by_etcd(up, check), "the node check's workers must reach etcd"
    ids = {rdzv_id(job), *map(rdzv_id, checks)}
    assert len(ids) == 3, f"every invocation needs its own rendezvous id: {ids}"
    calls = (tmp_path / "calls").read_text()
    assert all(f"delete pytorchjob {c['metadata']['name']}" in calls for c in checks)
    # What the check judges, with the flags the stack gives it: NCCL over TCP between nodes on
    # this EFA profile fails it, whatever the bandwidth floor.
    flags = config_from_namespace(build_parser().parse_args(training_flags(container(checks[0])["command"]))).node_check
    assert flags.node_check_efa > 0
    sockets = check_judge.transport_of([SOCKET_LINE], "nccl", 16)
    assert check_judge.transport_failures(sockets, flags.node_check_efa, nodes=2), "TCP on EFA must fail the check"

    # The job ends; the same job again, twice: new objects, new ids, the same spec otherwise.
    rerun = f'eval "$(pulumi stack output {Export.JOB_RERUN_COMMAND})"'
    assert rerun in commands
    reruns = new_runs(shell, rerun, 2)
    time.sleep(STAMP_SECONDS)
    reruns += new_runs(shell, rerun, 3)
    for again in reruns:
        assert admitted_by_etcd(up, again)
        assert json.loads(json.dumps(again).replace(again["metadata"]["name"], job["metadata"]["name"])) == job
    ids |= set(map(rdzv_id, reruns))
    assert len(ids) == 5, f"every re-run needs its own rendezvous id: {ids}"

    # Scale to zero. With the autoscaler (the default) nothing is typed: it removes the nodes after
    # the delay (tests/infra/test_lifecycle_autoscaling.py) and `pulumi up` leaves the size to it.
    # With it off, README's command, then `pulumi up`, which refreshes first and restores the sizes.
    if cluster == "new":
        scale = f'eval "$(pulumi stack output {Export.GPU_SCALE_TO_ZERO_COMMAND})"'
        assert scale not in commands, "the quickstart ends without a manual scale command"
        assert up.one(NODE_GROUP, "gpu-gpu").ignore_changes == ["scalingConfig.desiredSize"], (
            "`pulumi up` would set the autoscaler's size back")
        off = run_program(variant_config("p5", gpuNodes={"scaleDownDelayMinutes": 0}), "lifecycle-autoscaler-off")
        [by_hand] = [p for p in README.split("\n\n") if p.startswith("Setting a size by hand") and scale in p]
        assert "`pulumi up`" in by_hand.split(scale, 1)[1], "README's next step after scaling to zero"
        assert "desiredSize=0" in off.exports[Export.GPU_SCALE_TO_ZERO_COMMAND]
        gpu_group = off.one(NODE_GROUP, "gpu-gpu")
        assert gpu_group.ignore_changes == [], "the refreshed `pulumi up` must restore the size"
        wanted = stack_config("p5")["fsdp-eks:gpuNodes"]
        assert int(gpu_group.inputs["scalingConfig"]["desiredSize"]) == wanted["desiredSize"] > 0
        # The alert that sends the user here says the same commands.
        rules = yaml.safe_load(RULES_FILE.read_text())
        [idle] = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuNodesIdle"]
        assert scale in idle["annotations"]["runbook"] and "pulumi up" in idle["annotations"]["runbook"]

    # The next job: a changed configuration is a new run (new name and id; the old one deleted first).
    nxt = run_program({**config, "fsdp-eks:job": {**config["fsdp-eks:job"], "maxSteps": 7}}, f"lifecycle-{cluster}-next")
    assert_releases_wait_for_what_they_need(nxt)
    next_job = job_of(nxt)
    assert rdzv_id(next_job) not in ids and admitted_by_etcd(nxt, next_job)
    assert nxt.one("kubernetes:kubeflow.org/v1:PyTorchJob").delete_before_replace

    # `pulumi destroy`: the reverse of the graph; the job goes before etcd and its namespace.
    assert commands[-1] == "pulumi destroy"
    pytorchjob = nxt.one("kubernetes:kubeflow.org/v1:PyTorchJob").name
    etcd = [r.name for r in nxt.of_type("kubernetes:apps/v1:Deployment") if r.inputs["metadata"]["name"] == "etcd"]
    assert etcd and set(etcd) <= waits_for(nxt, pytorchjob)
