"""The training workload on every stack file, run whole under mocks: PyTorchJob, etcd, operator, Secret.

Checked against: the Kubeflow Training Operator v1.9.4 PyTorchJob CRD (tests/fixtures/kubeflow,
copied from upstream), Kubernetes 1.33's OpenAPI schemas through ``kubernetes-validate`` (strict),
the operator's elastic env generation and webhook rules (docs/design.md "Rendezvous and the Training
Operator"), the profile table (components/planning/hardware.py) and the training package's CLI contract.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from components import rendezvous, versions
from components.cluster import SYSTEM_NODE_LABEL
from offline.recording import is_secret_value
from components.planning.hardware import PROFILES
from components.settings import JobSettings
from components.settings_parser import snake
from components.stack import Export
from components.training_job import pytorchjob_manifest
from tests.conftest import recording_of
from tests.harness import (
    DUMMY_SECRETS,
    GPU_TAINT,
    PYTORCHJOB,
    Recording,
    container,
    job_of,
    plain,
    stack_config,
    tolerates,
    variant,
    worker,
)
from training import config as training_config
from training.config import build_parser, config_from_namespace

CRD_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "kubeflow" / (
    f"kubeflow-training-operator-{versions.TRAINING_OPERATOR_REF}-pytorchjobs-crd.yaml"
)
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
SERVICE = "kubernetes:core/v1:Service"
SECRET = "kubernetes:core/v1:Secret"
NAMESPACE = "kubernetes:core/v1:Namespace"
KUSTOMIZE = "kubernetes:kustomize/v2:Directory"
TOKEN = DUMMY_SECRETS["fsdp-eks:hfToken"]
TORCHRUN_FLAGS_FROM_ENV = ("--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv", "--max-restarts",
                           "--max_restarts", "--standalone", "--node-rank", "--node_rank", "--master")
"""torchrun flags the operator's PET_* environment sets; an explicit one overrides it."""


# --------------------------------------------------------------------------- helpers


@functools.cache
def crd_schema() -> dict:
    """The v1 openAPIV3Schema of the CRD (parsed once: the file is 644 kB). Do not mutate it."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    assert crd["spec"]["names"]["kind"] == "PyTorchJob"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def undeclared_keys(obj, schema: dict, path: str = "") -> list[str]:
    """Paths of keys the structural schema does not declare: the API server prunes them."""
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        found = []
        for key, value in obj.items():
            here = f"{path}.{key}"
            if props is not None and key in props:
                found += undeclared_keys(value, props[key], here)
            elif isinstance(extra, dict):
                found += undeclared_keys(value, extra, here)
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(here)
        return found
    if isinstance(obj, list):
        items = schema.get("items", {})
        return [k for i, v in enumerate(obj) for k in undeclared_keys(v, items, f"{path}[{i}]")]
    return []


def profile_of(stack: str):
    return PROFILES[stack_config(stack)["fsdp-eks:profile"]]


def job_config(stack: str) -> dict:
    return stack_config(stack)["fsdp-eks:job"]


# --------------------------------------------------------------------------- the CRD schema


def test_pytorchjob_validates_against_the_v1_9_4_crd(recording: Recording):
    """Checked against the CRD's openAPIV3Schema (Draft 4: types, required fields, patterns)."""
    job = job_of(recording)
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in jsonschema.Draft4Validator(crd_schema()).iter_errors(job)]
    assert not errors, errors


def test_pytorchjob_has_no_key_the_crd_does_not_declare(recording: Recording):
    """Checked against the CRD's structural schema: an undeclared key would be silently pruned."""
    job = job_of(recording)
    assert set(job) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(job["metadata"]) <= {"name", "namespace", "labels", "annotations"}
    schema = crd_schema()["properties"]["spec"]
    assert undeclared_keys(job["spec"], schema, "spec") == []


@pytest.mark.parametrize("where, key", [
    (("spec", "elasticPolicy"), "nnodes"),
    (("spec", "pytorchReplicaSpecs", "Worker", "template", "spec"), "gpus"),
    (("spec",), "nProcPerNode"),
])
def test_the_walker_reports_a_key_the_crd_would_prune(where, key):
    """The check above can fail: checked against keys the v1.9.4 CRD does not declare."""
    job = pytorchjob_manifest(JobSettings(), PROFILES["p5"], image="img@sha256:0", namespace="training",
                              rdzv_host="etcd.training.svc", hf_secret="hf-token")
    node = job
    for part in where:
        node = node[part]
    node[key] = 1
    assert undeclared_keys(job["spec"], crd_schema()["properties"]["spec"], "spec") == [".".join((*where, key))]


# --------------------------------------------------------------------------- the job, per stack


def test_container_is_pytorch_with_the_profiles_gpus_and_efa(recording: Recording, stack: str):
    """Checked against the operator's container-name rule and the profile table."""
    job, p = job_of(recording), profile_of(stack)
    res = container(job)["resources"]
    for resource, count in (("nvidia.com/gpu", p.gpus), ("vpc.amazonaws.com/efa", p.efa_interfaces)):
        assert res["requests"][resource] == res["limits"][resource] == str(count), resource
    assert job["spec"]["nprocPerNode"] == str(p.gpus)
    assert worker(job)["replicas"] == job_config(stack)["nodes"]
    assert worker(job)["restartPolicy"] == "OnFailure"
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Worker"}, "with elasticPolicy the operator runs Workers only"


def test_pod_lands_on_the_gpu_nodes_with_shm_and_nvme(recording: Recording, stack: str):
    """Checked against the GPU taint and labels, and the AL2023 NodeConfig's RAID0 mount point."""
    spec = worker(job_of(recording))["template"]["spec"]
    assert spec["nodeSelector"]["node.kubernetes.io/instance-type"] == profile_of(stack).instance_type
    # With FSx, only nodes whose Lustre client loaded at boot (the label their user data sets).
    fsx = stack_config(stack).get("fsdp-eks:storage", {}).get("fsx", False)
    assert (spec["nodeSelector"].get("fsdp-eks/lustre-client") == "ready") == fsx
    assert tolerates(spec["tolerations"], GPU_TAINT)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container(job_of(recording))["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    nvme = [name for name, v in volumes.items() if v.get("hostPath", {}).get("path") == "/mnt/k8s-disks/0"]
    assert nvme and set(mounts.values()) >= set(nvme)


def test_worker_environment_is_efa_ready_and_debuggable(recording: Recording):
    """Checked against docs/design.md#image: fork-safe EFA, async NCCL errors, the flight recorder
    writing to local NVMe, NCCL logs that show the provider, and no legacy EFA variables."""
    c = container(job_of(recording))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FI_EFA_USE_HUGE_PAGE"] == "0"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["NCCL_DEBUG"] == "INFO", "a healthy run logs 'Selected provider is efa, fabric is ...'"
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0 and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    nvme_mounts = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "nvme"]
    assert any(env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(path + "/") for path in nvme_mounts)
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1", "restarts break with the shared store"
    assert not {"FI_PROVIDER", "NCCL_PROTO", "FI_EFA_USE_DEVICE_RDMA", "RDMAV_FORK_SAFE"} & set(env)


def test_command_is_torchrun_module_without_flags_the_operator_sets(recording: Recording, stack: str):
    """Checked against the operator's PET_* environment: explicit torchrun flags override it.
    The launcher is torchrun's own main (training/launch.py), which reads the same PET_*."""
    command = container(job_of(recording))["command"]
    head = command[: command.index("training.finetune") + 1]
    assert head == ["python", "-m", "training.launch", "-m", "training.finetune"], head
    assert not [a for a in command if a.startswith(TORCHRUN_FLAGS_FROM_ENV)]
    parsed = training_config.flat(config_from_namespace(build_parser().parse_args(
        command[len(head):])))
    training_keys = {k: v for k, v in job_config(stack).items() if snake(k) in parsed}
    assert {"model", "seqLen", "sharding", "batchSize"} <= training_keys.keys()
    for key, value in training_keys.items():
        assert parsed[snake(key)] == value, f"job.{key} in Pulumi.{stack}.yaml is not what the pod runs"
    assert parsed["metrics_port"] == 9402


def test_elastic_policy_names_the_run_and_the_etcd_service(recording: Recording, stack: str):
    """Checked against docs/design.md#rendezvous-and-the-training-operator: rdzvId set per run, min = max = nodes unless asked, etcd host."""
    job = job_of(recording)
    policy = job["spec"]["elasticPolicy"]
    nodes = job_config(stack)["nodes"]
    assert policy["rdzvId"] == job["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job["metadata"]["name"]), "DNS-1035 label"
    assert len(f"{job['metadata']['name']}-worker-{nodes - 1}") <= 63
    assert (policy["minReplicas"], policy["maxReplicas"]) == (nodes, nodes)
    assert policy["rdzvBackend"] == "etcd"
    service = plain(recording.one(SERVICE, "training-job-etcd-service").inputs)
    ns = job["metadata"]["namespace"]
    assert service["metadata"]["namespace"] == ns
    assert policy["rdzvHost"] == f"{service['metadata']['name']}.{ns}.svc"
    assert policy["rdzvPort"] in [p["port"] for p in service["spec"]["ports"]]


def test_job_is_created_after_the_operator_and_etcd(recording: Recording):
    """Checked against the operator's CRD and webhook: they must exist before the job."""
    deps = recording.one(PYTORCHJOB).dependencies
    assert recording.one(KUSTOMIZE).name in deps
    assert "training-job-etcd-deployment" in deps and "training-job-hf-token" in deps


def test_a_new_run_deletes_the_old_one_first(recording: Recording):
    """Checked against the GPUs: a replacement must free them before the new run is scheduled."""
    assert recording.one(PYTORCHJOB).delete_before_replace is True
    assert recording.one(DEPLOYMENT, "training-job-etcd-deployment").delete_before_replace is False


def test_image_is_our_digest_pinned_ecr_image(recording: Recording):
    """Checked against the ECR repository's URL: the job runs what we pushed, pinned by digest."""
    repo = recording.one("aws:ecr/repository:Repository")
    url = f"{recording.exports['image_ref'].split('/')[0]}/{repo.inputs['name']}"
    image = container(job_of(recording))["image"]
    assert image == recording.exports[Export.IMAGE_REF]
    assert re.fullmatch(re.escape(url) + r":[0-9a-f]{16}@sha256:[0-9a-f]{64}", image), image


# --------------------------------------------------------------------------- the secret


def test_hf_token_reaches_the_pod_only_through_secret_key_ref(recording: Recording):
    """Checked against docs/design.md#architecture (secrets): Secret + secretKeyRef, never inline."""
    raw_secret = recording.one(SECRET, "training-job-hf-token").inputs
    assert is_secret_value(raw_secret["stringData"]), "stringData must be a Pulumi secret"
    secret = plain(raw_secret)
    (hf,) = [e for e in container(job_of(recording))["env"] if e["name"] == "HF_TOKEN"]
    ref = hf["valueFrom"]["secretKeyRef"]
    assert "value" not in hf
    assert ref["name"] == secret["metadata"]["name"] and secret["stringData"][ref["key"]] == TOKEN
    assert secret["metadata"]["namespace"] == job_of(recording)["metadata"]["namespace"]


def test_the_token_appears_in_no_job_input_and_no_export(recording: Recording):
    """Checked against the dummy token the harness sets: its text is nowhere but the Secret."""
    assert TOKEN not in json.dumps(recording.one(PYTORCHJOB).inputs)
    assert not [k for k, v in recording.exports.items() if TOKEN in json.dumps(v, default=str)]
    holders = [r.name for r in recording.resources if TOKEN in json.dumps(r.inputs, default=str)]
    assert holders == ["training-job-hf-token"], holders


# --------------------------------------------------------------------------- etcd and the operator


def test_etcd_is_pinned_3_5_with_the_v2_api_on_the_system_nodes(recording: Recording):
    """Checked against docs/design.md#rendezvous-and-the-training-operator: torch's etcd backends speak v2, served by 3.5 with --enable-v2."""
    deployment = plain(recording.one(DEPLOYMENT, "training-job-etcd-deployment").inputs)
    spec = deployment["spec"]["template"]["spec"]
    (etcd,) = spec["containers"]
    assert etcd["image"] == versions.ETCD_IMAGE
    assert re.fullmatch(r"quay\.io/coreos/etcd:v3\.5\.\d+", etcd["image"])
    assert "--enable-v2=true" in etcd["command"]
    assert spec["nodeSelector"] == SYSTEM_NODE_LABEL
    for probe in ("readinessProbe", "livenessProbe"):
        assert etcd[probe]["httpGet"] == {"path": "/health", "port": rendezvous.CLIENT_PORT}
    assert etcd["resources"]["requests"]["cpu"] and etcd["resources"]["requests"]["memory"]


def test_operator_is_the_vendored_v1_9_4_overlay_applied_server_side(recording: Recording):
    """Checked against docs/design.md#rendezvous-and-the-training-operator: pinned tag, never master, server-side apply (CRD > 262 kB). The
    directory is the repository's own (no git at deploy time), relative to the project root, and
    builds on the vendored v1.9.4 standalone overlay (rendered in test_rendered)."""
    operator = recording.one(KUSTOMIZE)
    directory = operator.inputs["directory"]
    assert directory == "vendor/kustomize/training-operator-system-nodes"
    root = Path(__file__).resolve().parents[2]
    kustomization = yaml.safe_load((root / directory / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../training-operator-v1.9.4/manifests/overlays/standalone"]
    provider = recording.one("pulumi:providers:kubernetes", operator.provider.split("::")[-2])
    assert provider.inputs["enableServerSideApply"] in (True, "true")
    assert recording.one(PYTORCHJOB).provider == operator.provider


# --------------------------------------------------------------------------- core objects


@pytest.mark.parametrize("type_", [NAMESPACE, SECRET, DEPLOYMENT, SERVICE])
def test_core_objects_validate_strictly(recording: Recording, type_: str):
    """Checked against Kubernetes 1.33's OpenAPI schemas (kubernetes-validate, strict)."""
    ours = [r for r in recording.of_type(type_) if r.name.startswith("training-job")]
    assert ours, f"no {type_} of the training job"
    for r in ours:
        kubernetes_validate.validate(plain(r.inputs), "1.33", strict=True)


def test_pod_monitor_scrapes_the_metrics_port_after_the_monitoring_stack(recording: Recording, stack: str):
    """Checked against the container's named port and kube-prometheus-stack's CRD ordering."""
    enabled = stack_config(stack)["fsdp-eks:observability"]["enabled"]
    monitors = recording.of_type("kubernetes:monitoring.coreos.com/v1:PodMonitor")
    assert len(monitors) == (1 if enabled else 0)
    if not enabled:
        return
    monitor = plain(monitors[0].inputs)
    job = job_of(recording)
    labels = worker(job)["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in [p["name"] for p in container(job)["ports"]]
    assert any(d.startswith("observability") for d in monitors[0].dependencies)


def test_outputs_name_the_job_and_give_kubectl_commands(recording: Recording):
    """Checked against the registered job: the commands name its namespace and name."""
    job = job_of(recording)
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    e = recording.exports
    assert e[Export.JOB_NAME] == name
    assert e[Export.JOB_STATUS_COMMAND] == f"kubectl -n {ns} describe pytorchjob {name}"
    pod_labels = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    selector = e[Export.JOB_LOGS_COMMAND].split(" -l ")[1].split()[0]
    key, value = selector.split("=")
    assert pod_labels[key] == value == name, "the log command must select this run's workers"
    assert "'[rank 0]'" in e[Export.JOB_LOGS_COMMAND], "the leader is global rank 0, wherever it runs"
    assert e[Export.JOB_DELETE_COMMAND] == f"kubectl -n {ns} delete pytorchjob {name}"
    assert not {Export.JOB_NAME, Export.IMAGE_REF, Export.JOB_STATUS_COMMAND} & recording.secret_exports


# --------------------------------------------------------------------------- c10d and no token


@pytest.fixture(scope="module")
def c10d_recording() -> Recording:
    """p5 with the c10d backend and an ungated model without a token (one extra program run)."""
    return variant("p5", drop=("hfToken",),
                   job={"rdzvBackend": "c10d", "model": "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "modelParameters": 1.1})


def test_c10d_needs_no_etcd_and_points_at_worker_0(c10d_recording: Recording):
    """Checked against the operator's endpoint rule: no rdzvHost means <job>-worker-0."""
    assert not [r for r in c10d_recording.of_type(DEPLOYMENT) if "etcd" in r.name]
    assert not [r for r in c10d_recording.of_type(SERVICE) if "etcd" in r.name]
    job = job_of(c10d_recording)
    policy = job["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d" and "rdzvHost" not in policy
    assert policy["rdzvPort"] in [p["containerPort"] for p in container(job)["ports"]]
    assert undeclared_keys(job["spec"], crd_schema()["properties"]["spec"], "spec") == []


def test_without_a_token_there_is_no_secret_and_no_hf_token_env(c10d_recording: Recording):
    """Checked against the settings: an ungated model needs no token, so none is wired."""
    assert not [r for r in c10d_recording.of_type(SECRET) if r.name.startswith("training-job")]
    assert "HF_TOKEN" not in [e["name"] for e in container(job_of(c10d_recording))["env"]]


def test_another_job_is_another_run(c10d_recording: Recording):
    """Checked across two program runs: a changed job renders a new name and rendezvous id."""
    a, b = job_of(recording_of("p5")), job_of(c10d_recording)
    assert a["metadata"]["name"] != b["metadata"]["name"]
    assert a["spec"]["elasticPolicy"]["rdzvId"] != b["spec"]["elasticPolicy"]["rdzvId"]
