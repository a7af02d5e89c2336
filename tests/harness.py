"""The offline runner and the settings parser, as the tests use them, the look-ups several test
modules share, and Kubernetes rules the tests apply."""

import copy
import dataclasses
import functools
import json
import os
import shutil
from typing import Any, NoReturn

import pytest

from components import versions
from components.settings import (
    SECRET_KEYS,
    JobSettings,
    Secrets,
    Settings,
    SettingsError,
    training_defaults,
)
from components.settings_parser import parse_settings
from components.training_job import LAUNCHER
from offline.mocks import run_program
from offline.recording import Recording, Registration, is_secret_value
from offline.stacks import DUMMY_SECRETS, STACKS, secure, stack_config
from training import config as training_config
from training.ports import free_port

__all__ = ["DUMMY_SECRETS", "STACKS", "Recording", "Registration", "run_program", "stack_config", "tolerates",
           "SECRETS", "raw_settings", "job_settings", "parse", "settings_error", "plain", "PYTORCHJOB", "job_of", "worker",
           "container", "parse_flags", "GPU_TAINT", "HELM", "POD_IDENTITY", "release", "installs_pin", "pod_identity",
           "trusted_by_pod_identity", "waits_for", "region_of", "variant_config", "variant", "require_tool",
           "tool_missing", "under_ci", "free_port", "secure"]

PYTORCHJOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
HELM = "kubernetes:helm.sh/v3:Release"
POD_IDENTITY = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
"""The taint on the GPU nodes, as the node group declares it (checked in test_cluster)."""

SECRETS = Secrets(hf_token="hf_x", grafana_admin_password="pw")


def raw_settings(stack: str) -> dict:
    """The fsdp-eks keys of a stack file, without namespace, secrets left out (a fresh copy)."""
    secret_keys = {f"fsdp-eks:{k}" for k in SECRET_KEYS}
    return {k.split(":", 1)[1]: copy.deepcopy(v) for k, v in stack_config(stack).items()
            if k.startswith("fsdp-eks:") and k not in secret_keys}


def variant_config(stack: str, *, drop: tuple[str, ...] = (), **sections: Any) -> dict:
    """A stack file's configuration (keys with namespace) with some sections changed: a dict
    section is merged key by key into the file's (``job={"nodes": 1}``), anything else replaces
    it (``profile="p4de"``); ``drop`` removes top-level keys (``drop=("hfToken",)``)."""
    config = copy.deepcopy(stack_config(stack))
    for key in drop:
        del config[f"fsdp-eks:{key}"]
    for section, value in sections.items():
        key = f"fsdp-eks:{section}"
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def variant(stack: str, *, drop: tuple[str, ...] = (), **sections: Any) -> Recording:
    """The whole program run under mocks for a variant of a stack file (``variant_config``'s
    arguments); the same variant asked twice runs once."""
    return _run_variant(stack, drop, json.dumps(sections, sort_keys=True))


@functools.cache
def _run_variant(stack: str, drop: tuple[str, ...], sections: str) -> Recording:
    return run_program(variant_config(stack, drop=drop, **json.loads(sections)), f"{stack}-variant")


def under_ci() -> bool:
    """True under CI (``.ci/run`` sets CI=true)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def tool_missing(message: str) -> NoReturn:
    """The one rule for a missing external tool: a failure under CI (whose ``.ci/run`` installs
    every tool), a skip with ``message`` (what is missing, how to install it) elsewhere."""
    if under_ci():
        pytest.fail(message)
    pytest.skip(message)


def require_tool(name: str, install: str) -> str:
    """The path of an external program a test runs, found on the PATH (``tool_missing`` if not)."""
    path = shutil.which(name)
    if path is None:
        tool_missing(f"{name} not found: {install}")
    return path


def job_settings(**values: Any) -> JobSettings:
    """A job with the stack's defaults and these fields changed: the job's own (``nodes``) and
    the training package's (``seq_len``), as snake_case names."""
    own = {k: values.pop(k) for k in list(values) if k in {f.name for f in dataclasses.fields(JobSettings)}}
    return JobSettings(training=training_config.from_fields({**training_defaults(values), **values}), **own)


def region_of(config: dict) -> str:
    """The region a stack file's GPU AZ lies in (``us-east-1a`` -> ``us-east-1``); us-west-2 without one."""
    az = config.get("gpuNodes", {}).get("availabilityZone") if isinstance(config.get("gpuNodes"), dict) else None
    return az[:-1] if isinstance(az, str) and az[-1:].isalpha() else "us-west-2"


def parse(config: dict, secrets: Secrets = SECRETS, stack: str = "test") -> Settings:
    """``parse_settings`` as a preview of stack ``stack`` would call it, in the region of the
    config's GPU AZ (as the stack files set ``aws:region``)."""
    return parse_settings(config, project="fsdp-eks", stack=stack, region=region_of(config), secrets=secrets)


def settings_error(config: dict, secrets: Secrets = SECRETS, stack: str = "test") -> SettingsError:
    """The error ``config`` must raise."""
    with pytest.raises(SettingsError) as info:
        parse(config, secrets, stack)
    return info.value


def waits_for(recording: Recording, name: str) -> set[str]:
    """Names of every resource ``name`` waits for, directly or through what it waits for: its
    ``depends_on`` and the resources its inputs come from, as the engine received them. Destroy
    runs this graph in reverse: ``name`` is deleted before all of them."""
    direct = {r.name: r.dependencies for r in recording.resources}
    seen: set[str] = set()
    todo = list(direct.get(name, []))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(direct.get(current, []))
    return seen


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Kubernetes' matching of a taint by a toleration list (an empty effect matches all)."""
    for t in tolerations:
        if t.get("operator") == "Exists":
            key_ok = t.get("key") in (None, taint["key"])
        else:
            key_ok = t.get("key") == taint["key"] and t.get("value") == taint["value"]
        if key_ok and t.get("effect") in (None, "", taint["effect"]):
            return True
    return False


# --------------------------------------------------------------------------- recorded inputs


def plain(value: Any) -> Any:
    """Recorded inputs as the API server would get them: secrets unwrapped to their value, whole
    floats (the engine passes every number as a float) as ints."""
    if is_secret_value(value):
        return plain(value["value"])
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def job_of(recording: Recording) -> dict:
    """The run's one PyTorchJob, as the API server would get it."""
    return plain(recording.one(PYTORCHJOB).inputs)


def worker(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def container(job: dict) -> dict:
    """The workers' ``pytorch`` container (the name the operator requires)."""
    (c,) = [c for c in worker(job)["template"]["spec"]["containers"] if c["name"] == "pytorch"]
    return c


def training_flags(command: list[str]) -> list[str]:
    """The training package's flags of a worker's command: what follows the launcher and its
    ``-m <module>``."""
    assert command[:len(LAUNCHER)] == list(LAUNCHER) and command[len(LAUNCHER)] == "-m", command
    return command[len(LAUNCHER) + 2:]


def parse_flags(args: list[str]) -> dict[str, str | None]:
    """``--flag value`` pairs and bare ``--switch`` flags of a command line."""
    flags: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else None
            flags[arg] = None if following is None or following.startswith("--") else following
    return flags


# --------------------------------------------------------------------------- AWS and Helm look-ups


def release(recording: Recording, chart: versions.HelmChart) -> Registration:
    """The run's one Helm release of ``chart`` (its vendored folder)."""
    found = [r for r in recording.of_type(HELM) if r.inputs["chart"] == f"./{chart.folder}"]
    assert len(found) == 1, f"expected one {chart.chart} release, found {[r.name for r in found]}"
    return found[0]


def installs_pin(registration: Registration, chart: versions.HelmChart) -> bool:
    """The release installs exactly the pinned chart from its vendored folder (the copy the
    rendering tests render), never from a repository."""
    inputs = registration.inputs
    if inputs.get("version") != chart.version or "latest" in chart.version:
        return False
    return inputs["chart"] == f"./{chart.folder}" and "repositoryOpts" not in inputs


def pod_identity(recording: Recording, namespace: str, account: str) -> tuple[Registration, Registration, str]:
    """The pod identity association of a service account, its role and the one managed policy
    attached to that role."""
    assocs = [r for r in recording.of_type(POD_IDENTITY)
              if (r.inputs["namespace"], r.inputs["serviceAccount"]) == (namespace, account)]
    assert len(assocs) == 1, f"{namespace}/{account}: {len(assocs)} pod identity associations"
    [assoc] = assocs
    [role] = [r for r in recording.of_type("aws:iam/role:Role") if assoc.inputs["roleArn"].endswith(f":{r.name}")]
    policies = [r.inputs["policyArn"] for r in recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if r.inputs["role"] == role.name]
    assert len(policies) == 1, f"{role.name}: attached {policies}"
    return assoc, role, policies[0]


def trusted_by_pod_identity(role: Registration) -> bool:
    """The role's trust policy lets EKS Pod Identity assume it (and tag the session)."""
    policy = json.loads(role.inputs["assumeRolePolicy"])
    return any(
        s["Effect"] == "Allow"
        and s["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        and set(s["Action"]) == {"sts:AssumeRole", "sts:TagSession"}
        for s in policy["Statement"]
    )
