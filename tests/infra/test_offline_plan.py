"""`make demo`'s offline plan: it shows what `pulumi up` would create and never leaks a secret.

Checked against the recorded registrations and the dummy secrets the harness sets."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from components.stack import Export
from offline import plan, stacks
from offline.plan import print_plan, write_manifests
from offline.stacks import DUMMY_SECRETS, ROOT
from tests.harness import Recording, stack_config


def test_written_yaml_holds_every_kubernetes_object_and_no_secret(recording: Recording, stack: str, tmp_path, capsys):
    written = write_manifests(recording, tmp_path)
    print_plan(recording, stack)
    printed = capsys.readouterr().out
    texts = {p.name: p.read_text() for p in written}
    for secret in DUMMY_SECRETS.values():
        assert secret not in printed, "a secret in the printed plan"
        for name, text in texts.items():
            assert secret not in text, f"a secret in {name}"
    kinds = {yaml.safe_load(t)["kind"] for n, t in texts.items() if not n.startswith("helm-")}
    assert {"PyTorchJob", "Secret", "Deployment", "Service", "Namespace"} <= kinds
    job = next(yaml.safe_load(t) for t in texts.values() if "kind: PyTorchJob" in t)
    assert job["metadata"]["name"] == recording.exports[Export.JOB_NAME]
    assert len(printed.splitlines()) > len(recording.resources), "one line per resource at least"


def test_the_plan_writes_numbers_as_the_stack_file_does(recording: Recording, stack: str, tmp_path, capsys):
    """Checked against the stack file: the engine passes every number as a float, and the plan
    prints and writes them as the user wrote them (``storageCapacity=1200``, ``replicas: 2``),
    never ``1200.0``."""
    config = stack_config(stack)
    storage, nodes = config["fsdp-eks:storage"], config["fsdp-eks:job"]["nodes"]
    print_plan(recording, stack)
    printed = capsys.readouterr().out
    if storage.get("fsx"):
        assert f"perUnitStorageThroughput={storage['fsxThroughputPerTiB']}, " in printed
        assert f"storageCapacity={storage['fsxStorageCapacityGiB']}, " in printed
    (job,) = [p for p in write_manifests(recording, tmp_path) if p.name.startswith("pytorchjob-")]
    assert f"\n      replicas: {nodes}\n" in job.read_text()


def test_two_runs_print_and_write_the_same_plan(tmp_path):
    """`make demo` twice gives the same text and the same files, byte for byte, so a user can
    diff two plans (the engine hands a resource's inputs over in no stable key order, which
    differs from one process to the next)."""
    runs = []
    for i in range(2):
        out = tmp_path / str(i)
        done = subprocess.run([sys.executable, "-m", "offline", "--stack", "p5", "--out", str(out)], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        files = {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*.yaml"))}
        runs.append((done.stdout.replace(str(out), "OUT"), files))
    assert runs[0][1] and runs[0] == runs[1]


def plan_of(stack_file: str, tmp_path, monkeypatch) -> str:
    """What ``python -m offline --stack bad`` says of a stack file ``Pulumi.bad.yaml`` that must be
    refused: the message it exits with. Nothing is written."""
    (tmp_path / "Pulumi.bad.yaml").write_text(stack_file)
    monkeypatch.setattr(stacks, "ROOT", tmp_path)
    monkeypatch.setattr(plan, "STACKS", ["bad"])
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as ended:
        plan.main(["--stack", "bad", "--out", str(out)])
    assert not out.exists(), "refused before anything is written"
    assert isinstance(ended.value.code, str), "a message, not a bare status"
    return ended.value.code


@pytest.mark.parametrize("stack_file, found", [
    ("config: [fsdp-eks:profile, p5]\n", "(stack file) = 'config: a list': must be a mapping"),
    ("config: p5\n", "(stack file) = 'config: a string': must be a mapping"),
    ("", "(stack file) = 'config: nothing': must be a mapping"),
    ("config:\n  fsdp-eks:job:\n    nodes: 2\n   seqLen: 5\n", "is not valid YAML"),
    ("config:\n  profile: p5\n", "(stack file) = 'config: profile': a key needs its namespace: `fsdp-eks:profile`"),
    ("config:\n  fsdp-eks:profile: p5\n  fsdp-eks:hfToken:\n    secure: AAABAKx\n",
     "(stack file) = 'fsdp-eks:hfToken': an encrypted value"),
])
def test_the_plan_of_a_file_that_is_no_stack_file_is_one_message(stack_file, found, tmp_path, monkeypatch):
    """Checked against Pulumi's stack file: a ``config:`` mapping of ``<namespace>:<name>`` keys
    (Pulumi's ParseKey refuses a key without its namespace). Before: a TypeError or KeyError
    traceback."""
    message = plan_of(stack_file, tmp_path, monkeypatch)
    assert found in message and "Traceback" not in message, message


def test_the_plan_of_a_wrong_stack_file_lists_every_problem(tmp_path, monkeypatch):
    """A stack file wrong in several places: the plan refuses it with every problem at once (the
    unknown profile hid the others before), the secret it gives in plain text named but not
    repeated, a key under a misspelt namespace named (the program reads only fsdp-eks: keys: it
    was ignored), and no traceback."""
    token = "hf_PlainTextTokenInTheStackFile42"
    stack_file = yaml.safe_dump({"config": {
        "aws:region": "us-west-2",
        "fsdp-eks:profile": "zz9-test",
        "fsdp-eks:hfToken": token,
        "fsdp-eks:network": {"vpcCidr": "bad", "availabilityZones": ["us-west-2a", "us-west-2c"]},
        "fsdp-eks:gpuNodes": {"availabilityZone": "us-west-2c", "desiredSise": 2},
        "fsdp-eks:job": {"seqLen": 4, "nodes": 1},
        "fsdp_eks:storage": {"fsx": True},
    }})
    message = plan_of(stack_file, tmp_path, monkeypatch)
    for problem in ("fsdp-eks:profile = 'zz9-test'", "fsdp-eks:hfToken = '(not shown)': stored in plain text",
                    "fsdp-eks:network.vpcCidr = 'bad'", "fsdp-eks:gpuNodes.desiredSise = 2: unknown key",
                    "fsdp-eks:job.seqLen = 4", "(fsdp_eks:storage) = 'fsdp_eks': not the project's namespace"):
        assert problem in message, message
    assert token not in message and "Traceback" not in message
