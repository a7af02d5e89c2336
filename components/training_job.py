"""The fine-tuning run: a Kubeflow PyTorchJob (``kubeflow.org/v1``) and what it needs in its namespace.

**A run is an object.** The job's name and ``elasticPolicy.rdzvId`` are a hash of the rendered
job (its spec and the digest-pinned image), so any change to the job settings or the training
code gives a new name: Pulumi replaces the object, deleting the old job first so that its GPUs
are free, and the new run rendezvouses under a fresh id (no ``RendezvousClosedError`` from a
previous run's state in etcd). An unchanged spec renders the same name and Pulumi changes
nothing, so a finished job is not run again. For that the job object must stay in the cluster
after it finishes: no ``ttlSecondsAfterFinished``.

**Every invocation rendezvouses under its own id.** torchrun closes the rendezvous of its run id
when the run ends, succeeded or failed (torch ``launcher/api.py``, ``launch_agent``: ``finally:
rdzv_handler.shutdown()``; only a signal skips it), and both etcd backends refuse a closed id
(``RendezvousClosedError``) until its etcd key expires two hours later (``etcd_rendezvous.py``
``CONST_RUNID_SUBROOT_TTL``, ``etcd_rendezvous_backend.py`` ``_DEFAULT_TTL``: 7,200 s). So the
same object may not simply be created again: the node check command and the re-run command
(``rerun_command``) create a copy of the stack output's manifest whose name, and with it
``rdzvId``, run label and run directory, carries the invocation's time (``fresh_run_command``).

**Elastic launch.** The operator turns ``elasticPolicy`` into torchrun's environment
(``PET_RDZV_BACKEND``, ``PET_RDZV_ENDPOINT``, ``PET_NNODES=min:max``, ``PET_MAX_RESTARTS``,
``PET_RDZV_ID``, and ``PET_NPROC_PER_NODE`` from ``spec.nprocPerNode``). The command therefore
passes none of those flags: an explicit ``--nnodes`` would override the environment and silently
turn elasticity off. With ``elasticPolicy`` the operator uses the ``Worker`` replicas only.

Rendezvous: ``etcd`` / ``etcd-v2`` use the in-cluster etcd Service. ``c10d`` leaves
``rdzvHost`` unset, so the operator points every worker at ``<job>-worker-0`` (a headless
Service per pod), whose torchrun agent hosts the TCP store because the endpoint names its own
host; ``rdzvPort`` is torchrun's c10d default. c10d has a single point of failure (worker 0's
pod), which is why etcd is the default.

**Node-local NVMe.** ``/mnt/k8s-disks/0`` (the node's instance-store RAID0) is mounted whole at
``/mnt/nvme`` (Hugging Face cache, shared by runs on the node) and, through a per-run ``subPath``
that the kubelet creates, at ``/mnt/run`` (checkpoints, the exported model, NCCL flight-recorder
dumps). An init container running as root hands those directories to the image's non-root user.

**Shared storage.** With a ``SharedClaim`` (components/storage.py: FSx for Lustre, or a claim the
user brings), every worker mounts it at ``/fsx`` and the checkpoints and exported model go to the
run's own ``/fsx/runs/<run>``: a multi-node distributed checkpoint is whole only where every node
writes. The init container creates that directory as root and hands it to the training user (the
file system's root belongs to root). The Hugging Face cache and the flight-recorder dumps stay on
NVMe. The job creates the claim in its namespace (namespace, then claim, then job).

**Least privilege** (``WORKER_SECURITY``, ``PREPARE_SECURITY``). The workers run as the image's
uid 1000, never escalate, keep no capability, use the runtime's default seccomp profile and get no
service-account token (nothing in the pod calls the Kubernetes API; rendezvous goes to etcd or
worker 0). EFA and NCCL need no more: the device plugins put the GPUs and ``/dev/infiniband/uverbs*``
into the container's device cgroup (their device nodes are world read-write: rdma-core's udev
rules, NVIDIA's driver), and libfabric's large locked-memory registrations need a high
``RLIMIT_MEMLOCK`` (awsome-distributed-ai#647: "Cannot allocate memory" at 64 KiB), which the GPU
nodes' containerd grants every container (components/gpu_nodes.py). ``IPC_LOCK`` would not help:
a non-root process has an empty effective capability set. The root filesystem stays writable:
torch.compile and Triton write their caches under ``/tmp`` and ``$HOME``; uid 1000 can write only
where the image lets it. The init container is the one exception to non-root, with two capabilities
(``PREPARE_SECURITY``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pulumi
import pulumi_kubernetes as k8s

from components import rendezvous
from components.gpu_nodes import GPU_TOLERATION
from components.node_quarantine import NodeQuarantine, NodeQuarantineArgs, pod_api_access, quarantine_toleration
from components.planning.hardware import HardwareProfile
from components.settings import JobSettings, gpus_per_node, job_node_bounds
from components.storage import SharedClaim
from training import config as training_config

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER = "pytorch"
"""The operator finds the training container by this name."""
METRICS_PORT = 9402
C10D_PORT = 29400
"""torchrun's default c10d rendezvous port."""
HF_SECRET = "hf-token"
HF_SECRET_KEY = "token"
APP_UID = 1000
"""The non-root user of training/Dockerfile."""
NVME_HOST_PATH = "/mnt/k8s-disks/0"
NVME = "/mnt/nvme"
RUN_DIR = "/mnt/run"
SHARED_DIR = "/fsx"
"""Where a shared claim is mounted; the run's checkpoints go to ``<SHARED_DIR>/runs/<run>``."""
HF_HOME = f"{NVME}/huggingface"
NCCL_TRACE_PREFIX = f"{RUN_DIR}/nccl_trace_rank_"
SHM_GIB = 64
SHM_SIZE = f"{SHM_GIB}Gi"
NCCL_TRACE_BUFFER_SIZE = 2000
"""Flight-recorder entries kept per process (collectives in flight when a hang is dumped)."""
MAX_NAME = 50
"""The job name plus ``-worker-<index>`` must stay a 63-character DNS label (pod and Service)."""
HASH_LENGTH = 10
INVOCATION_STAMP = "$(date -u +%m%d%H%M%S)"
"""Shell: the invocation's UTC time to the second, the suffix of a re-run's or a node check's
name. Unique for far longer than the two hours a closed run id stays in etcd; two invocations
in one second get one name, and ``kubectl create`` refuses the second (AlreadyExists) rather
than letting it share the first's rendezvous."""
INVOCATION_STAMP_LENGTH = 10
"""Characters the stamp prints (``MMDDhhmmss``)."""
BASE_NAME = MAX_NAME - INVOCATION_STAMP_LENGTH - 1
"""The rendered name's limit: room is left for ``-<stamp>``."""
RUN = "@RUN@"
"""Placeholder for the run's name while the manifest is hashed."""
RUN_LABEL = "fsdp-eks/run"
"""Pod label naming the run: how the log command finds every worker of it."""
WORKER_SECURITY = {
    "pod": {
        "runAsUser": APP_UID,
        "runAsGroup": APP_UID,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "container": {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    },
}
"""The workers' pod and ``pytorch`` container security contexts (module docstring, "Least privilege")."""
PREPARE_SECURITY = {
    # Root, because the directories it hands over belong to root: the kubelet creates hostPath
    # subPaths as root and a shared file system's root is root's.
    "runAsUser": 0,
    "runAsNonRoot": False,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {
        "drop": ["ALL"],
        # CHOWN: hand the run's directories to uid 1000. DAC_OVERRIDE: on a restarted pod or a later
        # run, directories on the path may already be uid 1000's (the training process made them),
        # where root without it is only "other". No FOWNER: nothing is chmod-ed.
        "add": ["CHOWN", "DAC_OVERRIDE"],
    },
}
"""The init container's security context: root with only what ``mkdir`` and ``chown`` need."""
RENDEZVOUS_CLIENT_LABELS = {"app.kubernetes.io/name": "fsdp-finetune", "app.kubernetes.io/part-of": "fsdp-eks"}
"""On the pods of every run and every node check: what etcd's NetworkPolicy admits."""
LABELS = {**RENDEZVOUS_CLIENT_LABELS, "app.kubernetes.io/component": "training"}
"""On every run's pods, so one PodMonitor scrapes every run."""
CHECK_LABELS = {"app.kubernetes.io/component": "node-check"}
"""What the node check job's objects carry instead of the training component (not scraped)."""
NODE_CHECK_NAME = "node-check"
JOB_MANIFEST_OUTPUT = "job_manifest"
"""The stack output holding the run's PyTorchJob, which ``rerun_command`` creates again
(components/stack.py exports it under this name)."""
NODE_CHECK_MANIFEST_OUTPUT = "node_check_manifest"
"""The stack output holding the node check's PyTorchJob, which ``node_check_command`` creates."""
NODE_CHECK_GRACE_S = 900
"""Seconds the node check command waits beyond the check's own limit: scheduling, the image
pull, the rendezvous."""
NODE_CHECK_POLL_S = 10
NODE_CHECK_LOG_HOLD_S = 3 * NODE_CHECK_POLL_S
"""Seconds a node check pod stays on the node it quarantined, so that ``node_check_command``
still reads its table: one poll for its processes to end and the job to be marked failed, one
for the command's next poll to see that, one for reading the log."""


# --------------------------------------------------------------------------- the pure builders


def model_slug(model: str, limit: int = BASE_NAME - HASH_LENGTH - 1) -> str:
    """A DNS-1035 label from a model id: ``meta-llama/Llama-2-7b-hf`` -> ``llama-2-7b-hf``."""
    last = model.rstrip("/").rsplit("/", 1)[-1].lower()
    slug = re.sub(r"[^a-z0-9]+", "-", last).strip("-")
    if not slug or not slug[0].isalpha():
        slug = f"job-{slug}".rstrip("-")
    return slug[:limit].rstrip("-")


def efa_per_node(job: JobSettings, profile: HardwareProfile) -> int:
    return profile.efa_interfaces if job.efa_per_node is None else job.efa_per_node


def node_check_thresholds(job: JobSettings, profile: HardwareProfile) -> dict[str, object]:
    """What the node check must find (training/node_check.py): the GPUs and EFA devices the pod
    requests, the pod's /dev/shm, and the profile's bus bandwidth floors (components/planning/hardware.py):
    over all ranks the EFA floor when the job may span nodes (scaled to the EFA interfaces
    requested; none without EFA: sockets are what was asked for), else the NVLink floor."""
    efa = efa_per_node(job, profile)
    multi_node = job_node_bounds(job)[1] > 1
    efa_floor = round(profile.min_efa_busbw_gbs * efa / profile.efa_interfaces, 1)
    return {
        "node_check_gpus": gpus_per_node(job, profile),
        "node_check_efa": efa,
        "node_check_min_shm_gib": float(SHM_GIB),
        "node_check_min_busbw_gbs": efa_floor if multi_node else profile.min_node_busbw_gbs,
        "node_check_min_node_busbw_gbs": profile.min_node_busbw_gbs,
    }


LAUNCHER = ("python", "-m", "training.launch")
"""What a worker pod runs: torchrun's own main, ending on SIGTERM with one line and status 143
instead of a traceback and 1 (training/launch.py); it reads the operator's PET_* as torchrun."""


def training_command(job: JobSettings, profile: HardwareProfile, data_dir: str = RUN_DIR,
                     module: str = "training.finetune") -> list[str]:
    """``python -m training.launch -m training.finetune`` (torchrun, ending on SIGTERM with one
    line and status 143 instead of a traceback and 1: training/launch.py) and the package's
    flags (its CLI contract).

    The flags come from the package's own config (``training.config.to_argv``): the job's
    training settings plus what the stack owns (checkpoint and export directories on the run's
    storage with the metrics JSONL, the Hugging Face cache on NVMe, the metrics port, the node
    check's thresholds). No torchrun flag: nodes, processes per node, rendezvous and restarts
    come from the operator's ``PET_*`` environment. The Hugging Face token is read from
    ``HF_TOKEN`` only.
    ``data_dir``: the run's directory for checkpoints and the exported model; ``module``:
    ``training.node_check`` runs only the check, with the same flags.
    """
    t = job.training
    config = replace(
        t,
        model=replace(t.model, cache_dir=HF_HOME),
        checkpoint=replace(t.checkpoint, checkpoint_dir=f"{data_dir}/checkpoints", output_dir=f"{data_dir}/output"),
        metrics=replace(t.metrics, metrics_port=METRICS_PORT, metrics_file=f"{data_dir}/metrics.jsonl"),
        node_check=replace(t.node_check, **node_check_thresholds(job, profile)),
    )
    return [*LAUNCHER, "-m", module, *training_config.to_argv(config)]


def _env(job: JobSettings, hf_secret: str | None) -> list[dict]:
    timeout_s = job.training.parallel.collective_timeout_s
    env = [
        {"name": "FI_EFA_USE_HUGE_PAGE", "value": "0"},
        # A hung collective ends the process within --collective-timeout-s: NCCL's watchdog
        # aborts the communicator and (1 = tear down) the process exits, so torchrun restarts
        # the group. The heartbeat monitor kills the process if the watchdog itself is stuck
        # (e.g. in a CUDA call on a GPU that fell off the bus) for as long (torch's
        # ProcessGroupNCCL; default 480 s otherwise, whatever the collective timeout).
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        {"name": "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "value": str(timeout_s)},
        {"name": "TORCH_NCCL_TRACE_BUFFER_SIZE", "value": str(NCCL_TRACE_BUFFER_SIZE)},
        {"name": "TORCH_NCCL_DUMP_ON_TIMEOUT", "value": "1"},
        {"name": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "value": NCCL_TRACE_PREFIX},
        {"name": "NCCL_DEBUG", "value": "INFO"},
        {"name": "HF_HOME", "value": HF_HOME},
        # The node check names nodes as Kubernetes does (the pod's host name is the pod's).
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        # torchrun otherwise shares its rendezvous TCP store with the workers, and a restarted
        # group can read the previous attempt's addresses (pytorch/pytorch#135712, reproduced
        # in tests/training/test_faults.py).
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
    ]
    if hf_secret is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": hf_secret, "key": HF_SECRET_KEY}}})
    return env


def _run_mounts(shared_claim: str | None) -> list[dict]:
    """NVMe, the run's directory on it, and the shared claim's file system when there is one."""
    return [
        {"name": "nvme", "mountPath": NVME},
        {"name": "nvme", "mountPath": RUN_DIR, "subPath": f"runs/{RUN}"},
        *([] if shared_claim is None else [{"name": "shared", "mountPath": SHARED_DIR}]),
    ]


def _worker_container(job: JobSettings, profile: HardwareProfile, image: str, hf_secret: str | None,
                      shared_claim: str | None, data_dir: str, module: str) -> dict:
    """The container that runs ``module`` under torchrun, with the node's GPUs and EFA devices."""
    gpus = gpus_per_node(job, profile)
    devices = {"nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa_per_node(job, profile))}
    ports = [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    if job.rdzv_backend == "c10d":
        ports.append({"name": "c10d", "containerPort": C10D_PORT, "protocol": "TCP"})
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": training_command(job, profile, data_dir, module),
        "env": _env(job, hf_secret),
        "ports": ports,
        "securityContext": dict(WORKER_SECURITY["container"]),
        "resources": {
            "requests": {"cpu": str(profile.pod_cpu_per_gpu * gpus),
                         "memory": f"{profile.pod_memory_gib_per_gpu * gpus}Gi", **devices},
            "limits": dict(devices),
        },
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, *_run_mounts(shared_claim)],
    }


def _prepare_container(image: str, shared_claim: str | None, data_dir: str) -> dict:
    """The init container that makes the run's directories and gives them to the training user."""
    made = [HF_HOME, f"{data_dir}/checkpoints", f"{data_dir}/output"]
    owned = [HF_HOME, RUN_DIR, *([data_dir] if data_dir != RUN_DIR else []), *made[1:]]
    return {
        # The kubelet creates hostPath subPaths as root, and a shared file system's root is
        # root's (FSx for Lustre): the training user must write to the run's directories.
        "name": "prepare-nvme",
        "image": image,
        "command": [
            "bash", "-c",
            f"mkdir -p {' '.join(made)} && chown {APP_UID}:{APP_UID} {' '.join(owned)}",
        ],
        "securityContext": dict(PREPARE_SECURITY),
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "volumeMounts": _run_mounts(shared_claim),
    }


def _pod_template(
    job: JobSettings, profile: HardwareProfile, image: str, hf_secret: str | None, shared_claim: str | None = None,
    module: str = "training.finetune",
    node_labels: Mapping[str, str] | None = None,
) -> dict:
    # Checkpoints and the exported model: the run's directory on the shared claim, else on NVMe.
    data_dir = RUN_DIR if shared_claim is None else f"{SHARED_DIR}/runs/{RUN}"
    shared_volumes = [] if shared_claim is None else [
        {"name": "shared", "persistentVolumeClaim": {"claimName": shared_claim}}
    ]
    return {
        "metadata": {"labels": {**LABELS, RUN_LABEL: RUN}},
        "spec": {
            "nodeSelector": {"node.kubernetes.io/instance-type": profile.instance_type, **(node_labels or {})},
            "tolerations": [dict(GPU_TOLERATION)],
            "securityContext": dict(WORKER_SECURITY["pod"]),
            # A token only to quarantine its own node (components/node_quarantine.py).
            **pod_api_access(),
            "initContainers": [_prepare_container(image, shared_claim, data_dir)],
            "containers": [_worker_container(job, profile, image, hf_secret, shared_claim, data_dir, module)],
            "volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
                # Directory, not DirectoryOrCreate: without the RAID the pod waits with a clear
                # event instead of filling the root volume.
                {"name": "nvme", "hostPath": {"path": NVME_HOST_PATH, "type": "Directory"}},
                *shared_volumes,
            ],
        },
    }


def _elastic_policy(job: JobSettings, rdzv_host: str | None, restarts: int) -> dict:
    """``restarts``: torchrun's restarts of the worker group (PET_MAX_RESTARTS)."""
    lo, hi = job_node_bounds(job)
    policy = {"rdzvBackend": job.rdzv_backend, "minReplicas": lo, "maxReplicas": hi,
              "maxRestarts": restarts, "rdzvId": RUN}
    if job.rdzv_backend == "c10d":
        policy["rdzvPort"] = C10D_PORT  # host unset: the operator uses <job>-worker-0
    else:
        if rdzv_host is None:
            raise ValueError(f"rdzv backend {job.rdzv_backend} needs the etcd host")
        policy.update(rdzvHost=rdzv_host, rdzvPort=rendezvous.CLIENT_PORT)
    return policy


def run_name(model: str, body: Mapping) -> str:
    """``<model slug>-<hash>``: the hash of the rendered job with the run's name left out."""
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{model_slug(model)}-{digest[:HASH_LENGTH]}"


def _job_spec(job: JobSettings, profile: HardwareProfile, template: dict, rdzv_host: str | None,
              check_only: bool) -> dict:
    """The PyTorchJob's spec: its rendezvous, processes per node, restarts and the workers' pod."""
    restarts = 0 if check_only else job.max_restarts
    return {
        "elasticPolicy": _elastic_policy(job, rdzv_host, restarts),
        "nprocPerNode": str(gpus_per_node(job, profile)),
        "runPolicy": {
            # Running pods of a finished or failed job go (freeing GPUs); finished pods stay
            # for their logs. A crash-looping worker fails the job after maxRestarts.
            "cleanPodPolicy": "Running",
            "backoffLimit": restarts,
        },
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": job.nodes,
                "restartPolicy": "Never" if check_only else "OnFailure",
                "template": template,
            }
        },
    }


def pytorchjob_manifest(
    job: JobSettings,
    profile: HardwareProfile,
    *,
    image: str,
    namespace: str,
    rdzv_host: str | None,
    hf_secret: str | None,
    shared_claim: str | None = None,
    node_labels: Mapping[str, str] | None = None,
    check_only: bool = False,
) -> dict:
    """The whole PyTorchJob object. Deterministic: equal inputs give an equal object and name.

    ``rdzv_host`` is the etcd Service's DNS name (None with ``c10d``); ``hf_secret`` the name of
    the Secret holding the Hugging Face token (None: no token); ``shared_claim`` the claim every
    worker mounts for checkpoints and the exported model (None: node-local NVMe), ``node_labels``
    what a node needs to mount it (``SharedClaim.node_labels``).
    ``check_only``: the one-off job of the node check command (``training.node_check`` with the
    job's flags, named ``node-check-<hash>``, no restart, not scraped).
    """
    template = _pod_template(job, profile, image, hf_secret, shared_claim,
                             "training.node_check" if check_only else "training.finetune", node_labels)
    if check_only:  # the PodMonitor selects the training pods' labels: not these
        template["metadata"]["labels"].update(CHECK_LABELS)
        template["spec"]["tolerations"].append(quarantine_toleration(NODE_CHECK_LOG_HOLD_S))
    body = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": RUN, "namespace": namespace,
                     "labels": {**LABELS, **(CHECK_LABELS if check_only else {})}},
        "spec": _job_spec(job, profile, template, rdzv_host, check_only),
    }
    name = run_name(NODE_CHECK_NAME if check_only else job.training.model.model, body)
    return json.loads(json.dumps(body).replace(RUN, name))


def pod_monitor_manifest(namespace: str) -> dict:
    """A PodMonitor scraping every run's pods on their ``metrics`` port (local rank 0 serves)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "fsdp-training", "namespace": namespace, "labels": dict(LABELS)},
        "spec": {
            "selector": {"matchLabels": dict(LABELS)},
            "namespaceSelector": {"matchNames": [namespace]},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def hf_secret_metadata(namespace: str) -> dict:
    """Metadata of the Secret holding the Hugging Face token (its data is a Pulumi secret)."""
    return {"name": HF_SECRET, "namespace": namespace, "labels": dict(LABELS)}


def status_command(namespace: str, name: str) -> str:
    """kubectl that shows the run's state and events."""
    return f"kubectl -n {namespace} describe pytorchjob {name}"


def logs_command(namespace: str, name: str, max_nodes: int) -> str:
    """kubectl that follows the run's log. With elastic rendezvous no pod is the fixed master:
    ranks are assigned at rendezvous, so the leader (global rank 0) may be any worker. Follow
    every worker and keep the lines of rank 0, the only rank that logs at INFO (step, loss,
    tokens/s, MFU)."""
    return (f"kubectl -n {namespace} logs -f -l {RUN_LABEL}={name} -c {CONTAINER} --prefix "
            f"--max-log-requests={max_nodes} | grep --line-buffered -F '[rank 0]'")


def delete_command(namespace: str, name: str) -> str:
    """kubectl that deletes the run: that frees the GPUs. ``rerun_command`` starts it anew; the
    next ``pulumi up`` (which refreshes first) also creates the stack's job again, under its own
    name: a run stopped by a signal did not close its rendezvous id (module docstring)."""
    return f"kubectl -n {namespace} delete pytorchjob {name}"


def fresh_run_command(output: str, name: str) -> str:
    """Shell that creates a new run from the stack output ``output`` (a PyTorchJob named ``name``)
    and sets ``$run`` to its name: ``name`` with the invocation's time appended everywhere it
    appears (object name, ``rdzvId``, run label, run directory), so every invocation rendezvouses
    under its own id (module docstring)."""
    return (f'run="{name}-{INVOCATION_STAMP}" && '
            f'pulumi stack output {output} --json | sed "s/{name}/$run/g" | kubectl create -f -')


def rerun_command(namespace: str, name: str, max_nodes: int) -> str:
    """Start the stack's run again as a new job (after it finished, failed or was deleted) and
    print the new job's name and the command that follows its log."""
    return (f"{fresh_run_command(JOB_MANIFEST_OUTPUT, name)} && "
            f"echo \"$run\"; echo \"logs: {logs_command(namespace, '$run', max_nodes)}\"")


def node_check_command(namespace: str, name: str, max_nodes: int, timeout_s: int) -> str:
    """Create a one-off node check job from the stack output ``NODE_CHECK_MANIFEST_OUTPUT`` (a new name and
    rendezvous id on every invocation, ``fresh_run_command``), wait until it succeeded or failed,
    print rank 0's table, delete the job (its report stays in its run directory's metrics.jsonl)
    and print its end state; the command's exit status is 0 only when the check succeeded. The
    GPUs must be free: its pods wait while a training job holds them."""
    run = '"$run"'
    job = f"kubectl -n {namespace} get pytorchjob {run}"
    finished = job + " -o jsonpath='{.status.conditions[?(@.status==\"True\")].type}'"
    polls = (timeout_s + NODE_CHECK_GRACE_S) // NODE_CHECK_POLL_S
    return (
        f"{fresh_run_command(NODE_CHECK_MANIFEST_OUTPUT, name)} && "
        f"for _ in $(seq {polls}); do {finished} | grep -qE 'Succeeded|Failed' && break; "
        f"sleep {NODE_CHECK_POLL_S}; done; "
        f"kubectl -n {namespace} logs -l {RUN_LABEL}={run} -c {CONTAINER} --tail=-1 "
        f"--max-log-requests={max_nodes} | grep -F '[rank 0]'; "
        f"state=$({job} -o jsonpath='{{.status.conditions[-1].type}}{{\"\\n\"}}'); "
        f"{delete_command(namespace, run)}; echo \"$state\"; [ \"$state\" = Succeeded ]"
    )


# --------------------------------------------------------------------------- the component


@dataclass(frozen=True, kw_only=True)
class TrainingJobArgs:
    """Inputs of ``TrainingJob``."""

    job: JobSettings
    profile: HardwareProfile
    image: pulumi.Input[str]
    """The digest-pinned image reference."""
    provider: k8s.Provider
    hf_token: pulumi.Output[str] | None = None
    """Pulumi secret; None: no Secret and no HF_TOKEN in the pod."""
    system_node_selector: Mapping[str, str] = field(default_factory=dict)
    """Where etcd runs."""
    operator: Sequence[pulumi.Resource] = ()
    """The Training Operator: the job is created after its CRD and webhook are ready."""
    monitoring: Sequence[pulumi.Resource] | None = None
    """The monitoring stack that installs the PodMonitor CRD; None: no PodMonitor."""
    shared: SharedClaim | None = None
    """The claim every worker mounts for checkpoints and the exported model; None: node-local NVMe."""
    ready: Sequence[pulumi.Resource] = ()
    """What the job's namespace (and so everything in it: etcd, the Secret, the job) waits for:
    the system nodes etcd runs on and cluster DNS (the cluster's ``ready``)."""


class TrainingJob(pulumi.ComponentResource):
    """Namespace, Hugging Face Secret, etcd (unless c10d), shared claim, the PyTorchJob and its PodMonitor."""

    def __init__(self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("fsdp-eks:job:TrainingJob", name, None, opts)
        ns = args.job.namespace
        in_cluster = pulumi.ResourceOptions(parent=self, provider=args.provider)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-namespace", metadata={"name": ns, "labels": dict(LABELS)},
            opts=pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(depends_on=list(args.ready))),
        )
        in_namespace = pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(depends_on=[self.namespace]))
        self.hf_secret = self._hf_secret(name, ns, args.hf_token, in_namespace)
        self.node_quarantine = NodeQuarantine(
            f"{name}-node-quarantine",
            NodeQuarantineArgs(namespace=ns, provider=args.provider, depends_on=[self.namespace]),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.rendezvous = self._rendezvous(name, args)
        image = pulumi.Output.from_input(args.image)
        self.manifest = image.apply(lambda i: self._render(args, i, check_only=False))
        # Not created: the node check command creates it on demand (a stack output).
        self.node_check_manifest = image.apply(lambda i: self._render(args, i, check_only=True))
        self.shared_claim = self._shared_claim(name, args.shared, in_namespace)
        self.pytorchjob = self._pytorchjob(name, args.operator, in_cluster)
        self.pod_monitor = self._pod_monitor(name, ns, args.monitoring, in_cluster)
        self.job_name = self.manifest.apply(lambda m: m["metadata"]["name"])
        max_nodes = job_node_bounds(args.job)[1]
        check_timeout_s = args.job.training.node_check.node_check_timeout_s
        self.status_command = self.job_name.apply(lambda n: status_command(ns, n))
        self.logs_command = self.job_name.apply(lambda n: logs_command(ns, n, max_nodes))
        self.delete_command = self.job_name.apply(lambda n: delete_command(ns, n))
        self.rerun_command = self.job_name.apply(lambda n: rerun_command(ns, n, max_nodes))
        self.node_check_command = self.node_check_manifest.apply(
            lambda m: node_check_command(ns, m["metadata"]["name"], max_nodes, check_timeout_s))
        self.register_outputs({"job_name": self.job_name, "namespace": ns, "status_command": self.status_command,
                               "logs_command": self.logs_command, "delete_command": self.delete_command,
                               "manifest": self.manifest, "rerun_command": self.rerun_command,
                               "node_check_manifest": self.node_check_manifest,
                               "node_check_command": self.node_check_command})

    def _rendezvous(self, name: str, args: TrainingJobArgs) -> rendezvous.Rendezvous | None:
        """etcd for the rendezvous, in the job's namespace on the system nodes (none with c10d)."""
        if args.job.rdzv_backend == "c10d":
            return None
        return rendezvous.Rendezvous(
            f"{name}-etcd",
            rendezvous.RendezvousArgs(
                namespace=args.job.namespace, provider=args.provider, node_selector=args.system_node_selector,
                client_labels=RENDEZVOUS_CLIENT_LABELS, depends_on=[self.namespace],
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _render(self, args: TrainingJobArgs, image: str, check_only: bool) -> dict:
        """The run's PyTorchJob (or the node check's) for this component's etcd, Secret and claim."""
        return pytorchjob_manifest(
            args.job, args.profile, image=image, namespace=args.job.namespace,
            rdzv_host=self.rendezvous.host if self.rendezvous else None,
            hf_secret=HF_SECRET if self.hf_secret else None,
            shared_claim=args.shared.name if args.shared else None,
            node_labels=args.shared.node_labels if args.shared else None,
            check_only=check_only,
        )

    def _pytorchjob(self, name: str, operator: Sequence[pulumi.Resource],
                    opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource:
        """The run, created after the operator and everything its pods mount or reach."""
        after = [self.namespace, self.node_quarantine, *operator, *([self.hf_secret] if self.hf_secret else []),
                 *([self.rendezvous] if self.rendezvous else []),
                 *([self.shared_claim] if self.shared_claim else [])]
        return k8s.apiextensions.CustomResource(
            f"{name}-pytorchjob",
            api_version=API_VERSION,
            kind=KIND,
            metadata=self.manifest.apply(lambda m: m["metadata"]),
            spec=self.manifest.apply(lambda m: m["spec"]),
            # A new name is a new run: free the old run's GPUs before the new one is scheduled.
            opts=pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(depends_on=after, delete_before_replace=True)
            ),
        )

    def _pod_monitor(self, name: str, namespace: str, monitoring: Sequence[pulumi.Resource] | None,
                     opts: pulumi.ResourceOptions) -> k8s.apiextensions.CustomResource | None:
        """The PodMonitor of every run's pods (none without the monitoring stack)."""
        if monitoring is None:
            return None
        monitor = pod_monitor_manifest(namespace)
        return k8s.apiextensions.CustomResource(
            f"{name}-podmonitor",
            api_version=monitor["apiVersion"],
            kind=monitor["kind"],
            metadata=monitor["metadata"],
            spec=monitor["spec"],
            # The PodMonitor CRD comes with the monitoring stack.
            opts=pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(depends_on=[self.namespace, *monitoring])
            ),
        )

    def _shared_claim(
        self, name: str, shared: SharedClaim | None, opts: pulumi.ResourceOptions
    ) -> k8s.core.v1.PersistentVolumeClaim | None:
        """The shared claim, when the job creates it (after the namespace, before the job)."""
        if shared is None or shared.manifest is None:
            return None
        return k8s.core.v1.PersistentVolumeClaim(
            f"{name}-shared-claim",
            metadata=shared.manifest["metadata"],
            spec=shared.manifest["spec"],
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=list(shared.ready))),
        )

    def _hf_secret(
        self, name: str, namespace: str, token: pulumi.Output[str] | None, opts: pulumi.ResourceOptions
    ) -> k8s.core.v1.Secret | None:
        if token is None:
            return None
        return k8s.core.v1.Secret(
            f"{name}-hf-token",
            metadata=hf_secret_metadata(namespace),
            type="Opaque",
            string_data={HF_SECRET_KEY: pulumi.Output.secret(token)},
            opts=opts,
        )
