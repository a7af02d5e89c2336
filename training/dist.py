"""Process-group setup from torchrun's environment (or a 1-process world without torchrun)."""

from __future__ import annotations

import datetime
import logging
import os
import resource
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from training.ports import free_port

SHARED_STORE_WARNING = (
    "torchrun shares its rendezvous TCPStore with the workers (TORCHELASTIC_USE_AGENT_STORE=True) "
    "and restarts are allowed: after a restart, workers can read the previous attempt's "
    "addresses from that store and fail to connect (gloo 'Connection refused', NCCL "
    "socketPollConnect; pytorch/pytorch#135712, #167288). Set "
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the environment of torchrun.")

SLOW_COLLECTIVE_TIMEOUT = datetime.timedelta(hours=3)
"""Timeout of the side group that waits for downloads (a 70B model is ~130 GB per node)."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    slow_group: dist.ProcessGroup
    """A gloo group with a long timeout, for waiting on one process per node (downloads)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def node_leader(self) -> int:
        """Global rank of local rank 0 on this node (torchrun numbers ranks node by node)."""
        return self.rank - self.local_rank


EFA_DEVICES = Path("/dev/infiniband")
"""Where the EFA device plugin puts the ``uverbs`` devices of the EFA interfaces a pod requested
(``vpc.amazonaws.com/efa``): their presence means libfabric will use EFA."""
RLIM_INFINITY = resource.RLIM_INFINITY


def _unit(limit: int) -> str:
    return "unlimited" if limit == RLIM_INFINITY else f"{limit // 1024} KiB"


def locked_memory_problem(soft_limit: int, efa: bool, mem_total_bytes: int) -> str | None:
    """Why EFA cannot run with this locked-memory limit, or None.

    libfabric's EFA provider registers (pins) its buffers: with a small RLIMIT_MEMLOCK it fails
    with "Libfabric error: (-12) Cannot allocate memory" (awslabs/awsome-distributed-training#647),
    and a non-root worker cannot raise the limit itself. Enough: unlimited, or at least the
    node's memory (the GPU nodes set 1 EB, components/gpu_nodes.py: nothing can lock more).
    """
    if not efa or soft_limit == RLIM_INFINITY or soft_limit >= mem_total_bytes:
        return None
    return (f"EFA devices are attached but the locked-memory limit (ulimit -l) is {_unit(soft_limit)}: "
            "libfabric's EFA provider cannot register its buffers and NCCL would fail with "
            "'Cannot allocate memory'. Set RLIMIT_MEMLOCK to unlimited for the containers on the "
            "GPU nodes: containerd's base runtime spec (NodeConfig spec.containerd.baseRuntimeSpec."
            "process.rlimits, components/gpu_nodes.py), or run without EFA (job.efaPerNode: 0).")


def _mem_total_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def check_locked_memory(devices: Path = EFA_DEVICES) -> str | None:
    """Log ``ulimit -l`` (one line per node) and return the problem EFA would hit, if any."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    efa = devices.is_dir() and any(devices.glob("uverbs*"))
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"[{socket.gethostname()}] ulimit -l: {_unit(soft)}; EFA devices: {'yes' if efa else 'no'}",
              file=sys.stderr, flush=True)
    return locked_memory_problem(soft, efa, _mem_total_bytes())


def init_distributed(timeout_s: float | None = None) -> DistEnv:
    """Join the job's process group: NCCL on CUDA (plus gloo for CPU tensors), gloo on CPU.

    ``timeout_s`` (``--collective-timeout-s``) bounds every collective of the default group:
    a rank that stops answering (a hung GPU, a SIGSTOPped or lost peer) makes the others raise
    after it, so the worker exits and torchrun restarts the group. gloo enforces it itself; on
    NCCL the watchdog enforces it, and tears the process down with
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` (the PyTorchJob sets it, and sets
    ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` to the same value: components/training_job.py).
    None: torch's defaults (10 min NCCL, 30 min gloo).
    """
    if "RANK" not in os.environ:  # plain `python -m training.finetune`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if (rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0):
        logging.getLogger(__name__).warning(SHARED_STORE_WARNING)
    local_rank = int(os.environ["LOCAL_RANK"])
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="cpu:gloo,cuda:nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend="gloo", timeout=timeout)
    slow = dist.new_group(backend="gloo", timeout=SLOW_COLLECTIVE_TIMEOUT)
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank,
                   local_world_size=local_world, device=device, slow_group=slow)


def batch_to_device(batch, device: torch.device) -> tuple[torch.Tensor, ...]:
    """A batch's tensors on `device`, copied without the host waiting for the GPU: on CUDA from
    page-locked memory, so the copy is queued like a kernel. From pageable memory the driver may
    wait for the stream to drain before it stages the copy, and the GPU then idles while the
    host queues the next step's first kernels."""
    if device.type != "cuda":
        return tuple(t.to(device) for t in batch)
    return tuple(t.pin_memory().to(device, non_blocking=True) for t in batch)


def all_sum(value: float | int, device: torch.device) -> float:
    """Sum a Python number over all ranks."""
    t = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item()
