"""The nodes and the fabric, checked with numbers before a job spends GPU-hours on them.

Per node (local rank 0 of each node): the GPUs the profile promises are present and healthy
(NVML where ``pynvml`` / nvidia-ml-py is importable: volatile uncorrectable ECC errors, retired
pages, remapped rows, Xid events during the check), ``ulimit -l`` large enough for EFA, the EFA
devices (``/dev/infiniband/uverbs*``, and libfabric's efa provider through ``fi_info -p efa``
where the image has it), the size of ``/dev/shm``, the Lustre module where the checkpoint
directory is on Lustre, and the checkpoint directory writable with a measured write and read
throughput. Per job (every rank): all-reduce and all-gather at the sizes FSDP moves for the
chosen model (one decoder layer, and the root unit: embedding and output head), bus bandwidth
per size as nccl-tests defines it, the transport NCCL used for its connections, and per node the
same all-reduce inside the node, so the slowest node is named.

Runs in ``training.finetune`` after the checks that need no GPU (training/preflight.py), before
the model's download (``--node-check``, on by default), and on its own with the same flags:
``torchrun ... -m training.node_check <the job's flags>``, which prints the table and writes the
report to ``--metrics-file``. On its own it reads the transport from NCCL's INFO lines, which
NCCL then writes to a file per rank (``NCCL_DEBUG_FILE``, `nccl_log_defaults`), not to the
terminal: a few hundred lines per rank would bury the table, which names the file. The probed paths are arguments (``Probe``) so tests
point them at directories they make.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import json
import logging
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from training.config import TINY_MODEL, JobConfig, NodeCheckConfig, parse_args
from training.dist import RLIM_INFINITY, DistEnv, init_distributed, locked_memory_problem
from training.errors import UserError
from training.logs import setup_logging
from training.metrics import JsonLines
from training.quarantine import quarantine_own_node
from training.shapes import SHAPES, ModelShape, shape_of_model
from training.tiny import LLAMA_KWARGS

log = logging.getLogger(__name__)

FALLBACK_SHAPE = "llama2-7b"
"""The sizes measured for a model the shape table does not know (a local directory)."""
STORAGE_PROBE_BYTES = 64 * 2**20
"""Bytes written (fsync'd) and read back in the checkpoint directory: a health figure that
takes well under a second on FSx or NVMe, not a benchmark of the file system."""
WARMUP_ITERATIONS = 2
TIMED_ITERATIONS = 5
FI_INFO_PATHS = ("/opt/amazon/efa/bin",)
"""Where the EFA installer puts ``fi_info`` when it is not on PATH."""
NCCL_LOG_NAME = "nccl.%h.%p.log"
"""The standalone check's NCCL log per process: NCCL replaces %h with the host name (up to its
first dot) and %p with the pid (``NCCL_DEBUG_FILE``, NVIDIA/nccl src/debug.cc)."""
NCCL_LOG_DIR = "nccl-logs"
"""Where those logs go: beside --metrics-file, else in the system's temporary directory."""
NCCL_CONNECTION = re.compile(r"via (NET/[^/\s]+(?: [^/\s]+)*|P2P|SHM|NVLS|CollNet)")
"""NCCL_DEBUG=INFO's connection lines: ``Channel 00/0 : 1[1] -> 8[0] [send] via NET/AWS
Libfabric/0/GDRDMA``, ``... via P2P/IPC``, ``... via NET/Socket/0``."""


# ----------------------------------------------------------------------------- results
STATUS = {True: "ok", False: "FAILED", None: "skipped"}
"""How the table shows a result's ``ok``."""


@dataclass
class Result:
    """One check on one node: passed (True), failed (False) or not applicable (None, with why)."""

    node: str
    check: str
    ok: bool | None
    figure: str
    values: dict = field(default_factory=dict)



@dataclass(frozen=True)
class Probe:
    """Where the per-node checks look: roots of the device, proc and sys trees, /dev/shm, the
    ``fi_info`` binary (None: not in the image), NVML (None: not importable), the GPUs this
    process sees (None: CUDA's count on a CUDA device, else none) and the pod's service-account
    directory the quarantine reads (None: the kubelet's, ``quarantine.SERVICE_ACCOUNT_DIR``)."""

    dev: Path = Path("/dev")
    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    shm: Path = Path("/dev/shm")
    fi_info: str | None = field(default_factory=lambda: shutil.which(
        "fi_info", path=os.pathsep.join([os.environ.get("PATH", ""), *FI_INFO_PATHS])))
    nvml: object | None = field(default_factory=lambda: _import_nvml())
    gpus: int | None = None
    service_account: Path | None = None


def _import_nvml() -> object | None:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    return pynvml


def node_name() -> str:
    """The Kubernetes node (``NODE_NAME``, from the pod's downward API) or the host name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


# ----------------------------------------------------------------------------- per-node checks
def check_gpu_count(node: str, expected: int, found: int) -> Result:
    if expected == 0:
        return Result(node, "gpus", None, f"{found} found, none required", {"found": found})
    return Result(node, "gpus", found >= expected, f"{found} of {expected} GPUs",
                  {"found": found, "expected": expected})


def check_gpu_health(node: str, nvml: object | None, devices: int) -> list[Result]:
    """Per GPU, what the driver keeps after a fault until the GPU is reset, so that the check of
    a restarted run still sees a fault that ended the run before it: volatile uncorrectable ECC
    errors (counted since the driver loaded; the EKS GPU AMI runs nvidia-persistenced, so that
    is since boot), retired pages pending or remapped rows pending or failed (the memory needs
    a reset or an RMA), the driver's recovery action (``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``:
    set by uncorrectable memory errors, Xid 48, 94, 95), and a GPU NVML reports lost (Xid
    79, fallen off the bus) or needing a reset. A counter the GPU or driver does not expose
    (A100 and H100 remap rows instead of retiring pages) is left out, not failed."""
    if devices == 0:
        return []
    if nvml is None:
        return [Result(node, "gpu health", None, "not checked: pynvml (nvidia-ml-py) is not "
                       "installed in the image")]
    nvml.nvmlInit()
    try:
        return [_one_gpu(node, nvml, i) for i in range(min(devices, nvml.nvmlDeviceGetCount()))]
    finally:
        nvml.nvmlShutdown()


GPU_UNUSABLE = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED")
"""NVML's answers for a GPU that cannot be used until it is reset or the node replaced."""
RECOVERY_ACTIONS = {1: "GPU reset", 2: "node reboot", 3: "drain peer-to-peer traffic",
                    4: "drain peer-to-peer traffic and GPU reset", 5: "IMEX domain recovery",
                    6: "PCIe bus reset", 7: "system reboot"}
"""``nvmlDeviceGpuRecoveryAction_t`` by value (0: none needed; NVIDIA's "Error Recovery and
Response Flags"). An unknown value is shown as its number and fails too."""


def _unusable(nvml: object, error: Exception) -> bool:
    return getattr(error, "value", None) in {getattr(nvml, name, None) for name in GPU_UNUSABLE}


def _nvml_value(nvml: object, fn: Callable[[], object]) -> object | None:
    """``fn()``, or None where the GPU does not expose it (NOT_SUPPORTED, no permission); a GPU
    that is lost or needs a reset raises on."""
    try:
        return fn()
    except nvml.NVMLError as e:
        if _unusable(nvml, e):
            raise
        return None


def _recovery_action(nvml: object, handle: object) -> int | None:
    """The driver's recovery action for the GPU; None where nvidia-ml-py or the driver predates
    the field (the driver answers per field, not by raising)."""
    field_id = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field_id is None:
        return None
    [value] = nvml.nvmlDeviceGetFieldValues(handle, [field_id])
    return value.value.uiVal if value.nvmlReturn == nvml.NVML_SUCCESS else None


def _one_gpu(node: str, nvml: object, index: int) -> Result:
    try:
        return _gpu_counters(node, nvml, index, nvml.nvmlDeviceGetHandleByIndex(index))
    except nvml.NVMLError as e:
        if not _unusable(nvml, e):
            raise
        return Result(node, f"gpu {index} health", False, f"NVML: {e}", {"gpu": index,
                                                                         "nvml_error": str(e)})


def _gpu_counters(node: str, nvml: object, index: int, h: object) -> Result:
    ecc = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetTotalEccErrors(
        h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
    pending_pages = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))
    retired = _nvml_value(nvml, lambda: len(nvml.nvmlDeviceGetRetiredPages(
        h, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)))
    rows = _nvml_value(nvml, lambda: nvml.nvmlDeviceGetRemappedRows(h))
    action = _nvml_value(nvml, lambda: _recovery_action(nvml, h))
    values = {"gpu": index, "uncorrectable_ecc": ecc, "retired_pages_dbe": retired,
              "retired_pages_pending": None if pending_pages is None else bool(pending_pages),
              "remapped_rows": None if rows is None else {"correctable": rows[0],
                                                          "uncorrectable": rows[1],
                                                          "pending": bool(rows[2]),
                                                          "failed": bool(rows[3])},
              "recovery_action": action}
    problems = [text for bad, text in (
        (bool(ecc), f"{ecc} uncorrectable ECC errors"),
        (bool(pending_pages), "retired pages pending a reset"),
        (rows is not None and bool(rows[2]), "remapped rows pending a reset"),
        (rows is not None and bool(rows[3]), "row remapping failed"),
        (bool(action), f"recovery action: {RECOVERY_ACTIONS.get(action, action)}"),
    ) if bad]
    seen = [f"ECC {ecc}" if ecc is not None else None,
            f"retired pages {retired}" if retired is not None else None,
            f"remapped rows {rows[1]}" if rows is not None else None]
    figure = "; ".join(problems) or ", ".join(s for s in seen if s) or "no counters exposed"
    return Result(node, f"gpu {index} health", not problems, figure, values)


class XidWatch:
    """NVML's critical Xid events during the check. NVML keeps no Xid history: a fault before
    the check shows in what the driver latches (`check_gpu_health`: the ECC counter, row
    remapping, the recovery action, a lost GPU), and in the node's kernel log, which DCGM's
    exporter reports as ``DCGM_FI_DEV_XID_ERRORS``."""

    def __init__(self, nvml: object | None, devices: int):
        self.nvml, self.events, self.reason = nvml, None, "not checked: no GPU"
        if nvml is None or devices == 0:
            return
        try:
            nvml.nvmlInit()
            self.events = nvml.nvmlEventSetCreate()
            for i in range(min(devices, nvml.nvmlDeviceGetCount())):
                nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i),
                                              nvml.nvmlEventTypeXidCriticalError, self.events)
        except nvml.NVMLError as e:
            self.reason = f"not checked: NVML refused Xid events ({e})"
            self.events = None

    def result(self, node: str) -> Result | None:
        if self.nvml is None:
            return None  # check_gpu_health says why
        if self.events is None:
            return Result(node, "xid", None, self.reason)
        xids = []
        try:
            while True:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
                xids.append(int(data.eventData))
        except self.nvml.NVMLError:  # TIMEOUT: no more events
            pass
        finally:
            self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        return Result(node, "xid", not xids,
                      f"Xid {', '.join(map(str, xids))} during the check" if xids
                      else "no Xid event during the check", {"xids": xids})


def check_locked_memory(node: str, soft_limit: int, efa_devices: int, mem_total: int) -> Result:
    """``ulimit -l`` against what libfabric's EFA provider needs (training/dist.py's rule)."""
    shown = "unlimited" if soft_limit == RLIM_INFINITY else f"{soft_limit // 1024} KiB"
    problem = locked_memory_problem(soft_limit, efa_devices > 0, mem_total)
    return Result(node, "ulimit -l", problem is None,
                  shown if problem is None else f"{shown}: {problem}",
                  {"soft_limit": None if soft_limit == RLIM_INFINITY else soft_limit})


def efa_devices(dev: Path) -> list[str]:
    return sorted(p.name for p in (dev / "infiniband").glob("uverbs*"))


def check_efa(node: str, expected: int, found: list[str], fi_info: str | None) -> list[Result]:
    """The uverbs devices the EFA device plugin mounts, and libfabric's efa provider."""
    if expected == 0:
        return [Result(node, "efa devices", None, f"{len(found)} found, none required",
                       {"found": len(found)})]
    results = [Result(node, "efa devices", len(found) >= expected,
                      f"{len(found)} of {expected} in /dev/infiniband",
                      {"found": len(found), "expected": expected})]
    if fi_info is None:
        results.append(Result(node, "libfabric efa", None, "not checked: no fi_info in the image"))
        return results
    try:
        out = subprocess.run([fi_info, "-p", "efa"], capture_output=True, text=True, timeout=30)
        providers = out.stdout.count("provider: efa")
        ok = out.returncode == 0 and providers > 0
        figure = (f"fi_info -p efa: {providers} efa endpoints" if ok
                  else f"fi_info -p efa: no efa provider (exit {out.returncode}: "
                       f"{(out.stderr or out.stdout).strip()[:200]})")
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, figure = False, f"fi_info -p efa did not run: {e}"
    results.append(Result(node, "libfabric efa", ok, figure))
    return results


def check_shm(node: str, shm: Path, min_gib: float) -> Result:
    try:
        st = os.statvfs(shm)
    except OSError as e:
        return Result(node, "/dev/shm", False, f"{shm}: {e.strerror}")
    gib = st.f_frsize * st.f_blocks / 2**30
    return Result(node, "/dev/shm", gib >= min_gib, f"{gib:.1f} GiB (need {min_gib:g})",
                  {"gib": gib, "min_gib": min_gib})


def mount_of(path: Path, mounts: Path) -> tuple[str, str]:
    """(mount point, file system type) holding ``path``, from a mounts table."""
    best = ("/", "unknown")
    resolved = str(path.resolve())
    for line in mounts.read_text().splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, parts[2])
    return best


def check_lustre(node: str, directory: Path, probe: Probe) -> Result:
    """Where the checkpoint directory is on Lustre (its mount's type), the client module must be
    loaded (``/sys/module/lustre`` or ``/proc/modules``)."""
    point, fstype = mount_of(directory, probe.proc / "self" / "mounts")
    if fstype != "lustre":
        return Result(node, "lustre module", None, f"not needed: {point} is {fstype}",
                      {"mount": point, "fstype": fstype})
    modules = probe.proc / "modules"
    loaded = (probe.sys / "module" / "lustre").is_dir() or (
        modules.is_file() and any(line.split()[:1] == ["lustre"]
                                  for line in modules.read_text().splitlines()))
    return Result(node, "lustre module", loaded,
                  f"{'loaded' if loaded else 'not loaded'} ({point} is lustre)",
                  {"mount": point, "fstype": fstype})


def check_storage(node: str, directory: Path, nbytes: int = STORAGE_PROBE_BYTES) -> Result:
    """Write ``nbytes`` (fsync'd) into the checkpoint directory and read them back with the page
    cache dropped for the file: MB/s both ways, 1 MB = 10^6 bytes."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".node-check-") as f:
            block = os.urandom(min(nbytes, 8 * 2**20))
            started = time.perf_counter()
            for written in range(0, nbytes, len(block)):
                f.write(block[:nbytes - written])
            f.flush()
            os.fsync(f.fileno())
            write_s = time.perf_counter() - started
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            started = time.perf_counter()
            with open(f.name, "rb", buffering=0) as r:
                read = sum(len(chunk) for chunk in iter(lambda: r.read(8 * 2**20), b""))
            read_s = time.perf_counter() - started
    except OSError as e:
        return Result(node, "checkpoint dir", False, f"{directory} is not writable: {e.strerror}")
    write_mbs, read_mbs = nbytes / write_s / 1e6, read / read_s / 1e6
    return Result(node, "checkpoint dir", read == nbytes,
                  f"write {write_mbs:,.0f} MB/s, read {read_mbs:,.0f} MB/s ({nbytes // 2**20} MiB)",
                  {"write_mbs": write_mbs, "read_mbs": read_mbs, "bytes": nbytes})


def _mem_total(proc: Path) -> int:
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def node_checks(cfg: NodeCheckConfig, checkpoint_dir: str | None, gpus_found: int,
                probe: Probe, node: str | None = None) -> list[Result]:
    """Every per-node check of this node."""
    node = node or node_name()
    xid = XidWatch(probe.nvml, gpus_found)
    found = efa_devices(probe.dev)
    results = [check_gpu_count(node, cfg.node_check_gpus, gpus_found),
               *check_gpu_health(node, probe.nvml, gpus_found),
               check_locked_memory(node, resource.getrlimit(resource.RLIMIT_MEMLOCK)[0],
                                   len(found), _mem_total(probe.proc)),
               *check_efa(node, cfg.node_check_efa, found, probe.fi_info),
               check_shm(node, probe.shm, cfg.node_check_min_shm_gib)]
    if checkpoint_dir:
        directory = Path(checkpoint_dir).expanduser()
        results += [check_lustre(node, directory, probe), check_storage(node, directory)]
    else:
        results.append(Result(node, "checkpoint dir", None, "no --checkpoint-dir"))
    watched = xid.result(node)
    return results + ([watched] if watched else [])


# ----------------------------------------------------------------------------- bandwidth
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
}
"""nccl-tests' bus bandwidth = algorithm bandwidth x this factor of the rank count
(NVIDIA/nccl-tests doc/PERFORMANCE.md): the bandwidth each rank's link carries, comparable
across rank counts and with the hardware's link speed."""


def bus_bandwidth(collective: str, nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algorithm, bus) bandwidth in GB/s (10^9 bytes/s); ``nbytes`` is the whole buffer: the
    all-reduce's, and the all-gather's output (as nccl-tests counts them)."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * BUS_FACTOR[collective](ranks)


def model_shape(model: str) -> tuple[str, ModelShape | None]:
    """The shape table's row for ``model`` (by hub id, or a local directory's config.json);
    the tiny preset's own shape; else the fallback's, named so."""
    if model == TINY_MODEL:
        k = LLAMA_KWARGS
        return "tiny", ModelShape(parameters=0, layers=k["num_hidden_layers"],
                                  hidden=k["hidden_size"], intermediate=k["intermediate_size"],
                                  heads=k["num_attention_heads"],
                                  kv_heads=k["num_key_value_heads"], vocab=k["vocab_size"])
    shape = shape_of_model(model)
    if shape is not None:
        return model, shape
    config = Path(model).expanduser() / "config.json"
    try:  # a config that is not a Llama's (or not JSON) falls back like an unknown model
        c = json.loads(config.read_text())
        return model, ModelShape(parameters=0, layers=c["num_hidden_layers"],
                                 hidden=c["hidden_size"], intermediate=c["intermediate_size"],
                                 heads=c["num_attention_heads"],
                                 kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                                 vocab=c["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return f"{FALLBACK_SHAPE} (the shape of {model} is unknown)", SHAPES[FALLBACK_SHAPE]


def fsdp_sizes(shape: ModelShape, param_bytes: int) -> list[tuple[str, str, int]]:
    """(collective, unit, bytes) FSDP moves per unit: the all-gather of its parameters in the
    compute dtype (``param_bytes`` per parameter) and the reduction of its gradients in fp32
    (reduce-scatter, measured as the all-reduce nccl-tests and the thresholds use), for one
    decoder layer and for the root unit (embedding and output head)."""
    units = (("layer", shape.layer_parameters), ("root", 2 * shape.vocab * shape.hidden))
    return [(collective, unit, params * size)
            for unit, params in units
            for collective, size in (("all_gather", param_bytes), ("all_reduce", 4))]


def _time_collective(collective: str, nbytes: int, group: dist.ProcessGroup,
                     device: torch.device, ranks: int) -> float:
    """Mean seconds of one collective over TIMED_ITERATIONS, after WARMUP_ITERATIONS."""
    if collective == "all_reduce":
        buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        op = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    else:
        out = torch.empty(max(ranks, nbytes // 4 // ranks * ranks), dtype=torch.float32,
                          device=device)
        shard = out[: out.numel() // ranks].clone()
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        op = lambda: gather(out, shard, group=group)  # noqa: E731
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(WARMUP_ITERATIONS):
        op()
    sync()
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(TIMED_ITERATIONS):
        op()
    sync()
    return (time.perf_counter() - started) / TIMED_ITERATIONS


@contextlib.contextmanager
def captured_stdout() -> Iterator[list[str]]:
    """What this process writes to file descriptor 1 meanwhile (NCCL's INFO lines go there),
    copied back to the real stdout afterwards."""
    lines: list[str] = []
    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            yield lines
        finally:
            libc.fflush(None)
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            os.write(1, text.encode())
            lines += text.splitlines()


def nccl_debug_path(pattern: str, host: str, pid: int) -> Path:
    """The file NCCL writes for ``NCCL_DEBUG_FILE=pattern``, expanded as NCCL does
    (src/debug.cc): %h the host name up to its first dot, with '%' and '/' made '-'; %p the
    pid; %% a '%'; any other %x kept."""
    short = host.split(".")[0].replace("%", "-").replace("/", "-")
    return Path(re.sub(r"%(.)", lambda m: {"h": short, "p": str(pid), "%": "%"}.get(
        m.group(1), m.group(0)), pattern))


def nccl_log_defaults(cfg: JobConfig, environ: dict) -> None:
    """The standalone check's NCCL logging, where the user has set none: INFO (its connection
    lines name the transport) into one file per process (`NCCL_LOG_NAME` in `NCCL_LOG_DIR`
    beside --metrics-file, or in the temporary directory where that cannot be made; created
    here: NCCL falls back to stdout when it cannot open the file). A NCCL_DEBUG or
    NCCL_DEBUG_FILE of the user's own stands. A file of an earlier process with this pid (pids
    repeat in containers) is removed, so that `nccl_lines` reads only this process's lines."""
    if "NCCL_DEBUG" in environ:
        return
    environ["NCCL_DEBUG"] = "INFO"
    if "NCCL_DEBUG_FILE" not in environ:
        metrics = cfg.metrics.metrics_file
        directory = Path(tempfile.gettempdir()) / NCCL_LOG_DIR
        if metrics:
            with contextlib.suppress(OSError):  # not writable there: the temporary directory
                (Path(metrics).expanduser().parent / NCCL_LOG_DIR).mkdir(parents=True,
                                                                          exist_ok=True)
                directory = Path(metrics).expanduser().parent / NCCL_LOG_DIR
        directory.mkdir(parents=True, exist_ok=True)
        environ["NCCL_DEBUG_FILE"] = str((directory / NCCL_LOG_NAME).resolve())
        nccl_debug_path(environ["NCCL_DEBUG_FILE"], socket.gethostname(),
                        os.getpid()).unlink(missing_ok=True)


@contextlib.contextmanager
def nccl_lines() -> Iterator[tuple[list[str], Path | None]]:
    """(NCCL's lines written by this process meanwhile, the file they were read from): from
    its ``NCCL_DEBUG_FILE`` where one is set (the lines written before are skipped; NCCL's file
    is line-buffered), else captured from stdout and copied back there (`captured_stdout`)."""
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        with captured_stdout() as lines:
            yield lines, None
        return
    path = nccl_debug_path(pattern, socket.gethostname(), os.getpid())
    start = path.stat().st_size if path.is_file() else 0
    lines: list[str] = []
    try:
        yield lines, path
    finally:
        ctypes.CDLL(None).fflush(None)
        if path.is_file():
            with path.open("rb") as f:
                f.seek(start)
                lines += f.read().decode(errors="replace").splitlines()


def transport_of(lines: list[str], backend: str, ranks: int) -> dict:
    """The transport NCCL used, from its own connection lines (``... via NET/Libfabric``,
    ``NET/AWS Libfabric`` in older aws-ofi-nccl releases: EFA; ``via NET/Socket``: TCP sockets; ``via P2P`` / ``SHM`` / ``NVLS``: inside the node)."""
    if backend != "nccl":
        return {"transport": f"{backend} (TCP)", "how": "the process group's backend"}
    if ranks == 1:
        return {"transport": "none", "how": "one rank: NCCL opens no connection"}
    found = sorted({m.group(1) for line in lines for m in [NCCL_CONNECTION.search(line)] if m})
    if not found:
        debug = os.environ.get("NCCL_DEBUG", "")
        return {"transport": "unknown",
                "how": f"no NCCL connection line seen (NCCL_DEBUG={debug or 'unset'}; "
                       "INFO prints them)"}
    nets = [f for f in found if f.startswith("NET/")]
    kind = ("EFA" if any("Libfabric" in n or "OFI" in n for n in nets)
            else "socket" if any("Socket" in n for n in nets)
            else nets[0][4:] if nets else "inside the node")
    return {"transport": kind, "how": "NCCL connection lines: via " + ", ".join(found)}


def measure(group: dist.ProcessGroup, device: torch.device,
            sizes: list[tuple[str, str, int]]) -> list[dict]:
    """This rank's seconds for every (collective, unit, bytes) in ``group``."""
    ranks = dist.get_world_size(group)
    return [{"collective": c, "unit": u, "bytes": n,
             "seconds": _time_collective(c, n, group, device, ranks)} for c, u, n in sizes]


# ----------------------------------------------------------------------------- the job's check
class NodeCheckFailed(UserError):
    """A node or the fabric failed a check: the message names the node, the check, the figures."""


@dataclass
class Report:
    """The whole check: every node's results, the job's bandwidth, the transport, timings."""

    passed: bool
    seconds: float
    model: str
    world_size: int
    nodes: int
    results: list[dict]
    bandwidth: list[dict]
    node_bandwidth: list[dict]
    transport: dict
    slowest_rank: dict | None
    slowest_node: dict | None
    failures: list[str]

    def record(self) -> dict:
        """The metrics-file record (``node_check/*`` keys)."""
        return {f"node_check/{k}": v for k, v in asdict(self).items()} | {
            "time/unix_s": time.time()}


def _with_timeout(fn: Callable[[], list[Result]], timeout_s: float, node: str) -> list[Result]:
    """``fn`` in a thread, abandoned after ``timeout_s`` (a hung mount or device)."""
    box: dict = {}

    def target() -> None:
        try:
            box["results"] = fn()
        except Exception as e:  # noqa: BLE001  a check that breaks is a failed check
            box["results"] = [Result(node, "node checks", False, f"raised {e!r}")]

    thread = threading.Thread(target=target, daemon=True, name="node-check")
    thread.start()
    thread.join(timeout_s)
    return box.get("results") or [Result(node, "node checks", False,
                                         f"did not finish within {timeout_s:g} s")]


def _bandwidth_rows(per_rank: list[list[dict]], ranks: int, floor: float,
                    nodes: list[str]) -> tuple[list[dict], dict | None]:
    """Per size: the slowest rank's time makes the figure (a collective is as fast as its
    slowest member); returns the rows and the slowest rank at the largest size."""
    rows, slowest = [], None
    for i, entry in enumerate(per_rank[0]):
        times = [r[i]["seconds"] for r in per_rank]
        worst = max(range(len(times)), key=times.__getitem__)
        algbw, busbw = bus_bandwidth(entry["collective"], entry["bytes"], times[worst], ranks)
        rows.append({**{k: entry[k] for k in ("collective", "unit", "bytes")},
                     "seconds": times[worst], "algbw_gbs": algbw, "busbw_gbs": busbw,
                     "slowest_rank": worst, "slowest_node": nodes[worst]})
    reduce_rows = [r for r in rows if r["collective"] == "all_reduce"]
    if reduce_rows:
        top = max(reduce_rows, key=lambda r: r["bytes"])
        slowest = {"rank": top["slowest_rank"], "node": top["slowest_node"],
                   "busbw_gbs": top["busbw_gbs"], "bytes": top["bytes"], "min_gbs": floor}
    return rows, slowest


def check_job(cfg: JobConfig, env: DistEnv, probe: Probe | None = None) -> Report | None:
    """The check, on every rank: per-node checks on local rank 0 of each node, the bandwidth
    test over all ranks and inside each node. Returns the report (the same on every rank), or
    None with ``--no-node-check``; raises ``NodeCheckFailed`` naming node, check and figures."""
    if not cfg.node_check.node_check:
        return None
    with _own_groups(datetime.timedelta(seconds=cfg.node_check.node_check_timeout_s)) as groups:
        return _check(cfg, env, probe or Probe(), groups)


@contextlib.contextmanager
def _own_groups(timeout: datetime.timedelta) -> Iterator[Callable[..., dist.ProcessGroup]]:
    """``dist.new_group`` with the check's timeout, each group it made destroyed when the
    check ends, passed or failed: the training makes its own groups, and on GPUs each NCCL
    communicator kept would hold GPU memory and NCCL resources for the whole run. Every rank
    destroys them in the same order (ncclCommAbort is collective in some NCCL versions)."""
    made: list[dist.ProcessGroup] = []

    def new_group(*args, **kwargs) -> dist.ProcessGroup:
        made.append(dist.new_group(*args, timeout=timeout, **kwargs))
        return made[-1]

    try:
        yield new_group
    finally:
        for group in reversed(made):
            dist.destroy_process_group(group)  # a rank outside the group: nothing to do


def _check(cfg: JobConfig, env: DistEnv, probe: Probe,
           new_group: Callable[..., dist.ProcessGroup]) -> Report:
    """`check_job`'s work, with its groups from ``new_group``: every node's own rows, the
    fabric, the verdict; a failing node's pod quarantines its node before the check raises."""
    nc = cfg.node_check
    started = time.perf_counter()
    objects = new_group(backend="gloo")
    local, gathered = _node_rows(cfg, env, probe, objects)
    nodes = [node for node, _ in gathered]
    results = [r for _, rows in gathered for r in rows]
    model, shape = model_shape(cfg.model.model)
    sizes = fsdp_sizes(shape, 2 if env.device.type == "cuda" else 4)
    bandwidth, slowest_rank, transport = _fabric(env, sizes, nodes, new_group, objects,
                                                 nc.node_check_min_busbw_gbs)
    node_bandwidth, slowest_node = _per_node(env, sizes, nodes, new_group, objects,
                                             nc.node_check_min_node_busbw_gbs)
    failures = [f"{r['node']}: {r['check']}: {r['figure']}" for r in results if r["ok"] is False]
    failures += _bandwidth_failures(slowest_rank, "all ranks", env.world_size)
    failures += _bandwidth_failures(slowest_node, "inside the node", env.local_world_size)
    failures += transport_failures(transport, nc.node_check_efa, len(set(nodes)))
    report = Report(passed=not failures, seconds=time.perf_counter() - started, model=model,
                    world_size=env.world_size, nodes=len(set(nodes)), results=results,
                    bandwidth=bandwidth, node_bandwidth=node_bandwidth, transport=transport,
                    slowest_rank=slowest_rank, slowest_node=slowest_node, failures=failures)
    _publish(report, cfg, env)
    if failures:
        quarantine_own_node(local, probe.service_account)  # local rank 0 holds its node's rows
        raise NodeCheckFailed("node check failed before training: " + "; ".join(failures)
                              + " (--no-node-check skips the check)")
    return report


def _node_rows(cfg: JobConfig, env: DistEnv, probe: Probe, objects: dist.ProcessGroup
               ) -> tuple[list[Result], list[tuple[str, list[dict]]]]:
    """This node's rows (on its local rank 0, within the check's time limit; none elsewhere)
    and every rank's (node, rows), gathered."""
    nc = cfg.node_check
    node = node_name()
    cuda = env.device.type == "cuda"
    expected_gpus = nc.node_check_gpus or (env.local_world_size if cuda else 0)
    checks = dataclasses.replace(nc, node_check_gpus=expected_gpus)
    local: list[Result] = []
    if env.is_local_main:
        gpus = probe.gpus if probe.gpus is not None else (
            torch.cuda.device_count() if cuda else 0)
        local = _with_timeout(lambda: node_checks(checks, cfg.checkpoint.checkpoint_dir, gpus,
                                                  probe, node),
                              nc.node_check_timeout_s, node)
    gathered: list = [None] * env.world_size
    dist.all_gather_object(gathered, (node, [asdict(r) for r in local]), group=objects)
    return local, gathered


def _fabric(env: DistEnv, sizes: list[tuple[str, str, int]], nodes: list[str],
            new_group: Callable[..., dist.ProcessGroup], objects: dist.ProcessGroup,
            floor: float) -> tuple[list[dict], dict | None, dict]:
    """The collectives over all ranks: the rows per size, the slowest rank, the transport."""
    backend = "nccl" if env.device.type == "cuda" else "gloo"
    fabric = new_group()
    with nccl_lines() if backend == "nccl" else contextlib.nullcontext(([], None)) as (lines,
                                                                                    nccl_log):
        mine = measure(fabric, env.device, sizes)
    transport = transport_of(lines, backend, env.world_size)
    if nccl_log is not None:
        transport["log"] = str(nccl_log)
    per_rank: list = [None] * env.world_size
    dist.all_gather_object(per_rank, mine, group=objects)
    bandwidth, slowest_rank = _bandwidth_rows(per_rank, env.world_size, floor, nodes)
    return bandwidth, slowest_rank, transport


def _per_node(env: DistEnv, sizes: list[tuple[str, str, int]], nodes: list[str],
              new_group: Callable[..., dist.ProcessGroup], objects: dist.ProcessGroup,
              floor: float) -> tuple[list[dict], dict | None]:
    """The all-reduce inside each node (multi-node jobs with several ranks per node): the
    node with the lowest bus bandwidth at the largest size is the slowest node."""
    names = sorted(set(nodes), key=nodes.index)
    per_node = [[r for r, n in enumerate(nodes) if n == name] for name in names]
    if len(names) < 2 or min(len(ranks) for ranks in per_node) < 2:
        return [], None
    groups = [new_group(ranks) for ranks in per_node]
    mine_index = names.index(nodes[env.rank])
    reduce_sizes = [s for s in sizes if s[0] == "all_reduce"]
    mine = measure(groups[mine_index], env.device, reduce_sizes)
    per_rank: list = [None] * env.world_size
    dist.all_gather_object(per_rank, mine, group=objects)
    rows = []
    for name, ranks in zip(names, per_node):
        node_rows, _ = _bandwidth_rows([per_rank[r] for r in ranks], len(ranks), floor,
                                       [nodes[r] for r in ranks])
        rows += [{**row, "node": name, "slowest_rank": ranks[row["slowest_rank"]]}
                 for row in node_rows]
    largest = max(r["bytes"] for r in rows)
    worst = min((r for r in rows if r["bytes"] == largest), key=lambda r: r["busbw_gbs"])
    return rows, {"rank": worst["slowest_rank"], "node": worst["node"],
                  "busbw_gbs": worst["busbw_gbs"], "bytes": largest, "min_gbs": floor}


def _bandwidth_failures(slowest: dict | None, where: str, ranks: int) -> list[str]:
    if slowest is None or not slowest["min_gbs"] or ranks < 2:
        return []
    if slowest["busbw_gbs"] >= slowest["min_gbs"]:
        return []
    return [f"{slowest['node']}: all-reduce bus bandwidth {where}: "
            f"{slowest['busbw_gbs']:.1f} GB/s at {slowest['bytes'] / 1e6:,.1f} MB, below "
            f"{slowest['min_gbs']:g} GB/s (slowest: rank {slowest['rank']})"]


def transport_failures(transport: dict, efa_devices: int, nodes: int) -> list[str]:
    """NCCL between nodes over TCP sockets where the pods were given EFA devices fails the check,
    whatever the bandwidth floor: it is EFA's most common silent failure (aws-ofi-nccl not
    loaded, or libfabric finding no EFA provider), and a profile without a published inter-node
    figure has no floor to catch it."""
    if efa_devices < 1 or nodes < 2 or transport["transport"] != "socket":
        return []
    return [f"transport: NCCL used TCP sockets between nodes with {efa_devices} EFA device(s) per "
            f"node ({transport['how']}); expected EFA (NET/Libfabric, aws-ofi-nccl)"]


def _publish(report: Report, cfg: JobConfig, env: DistEnv) -> None:
    """Rank 0: the metrics file and the log (the table)."""
    if not env.is_main:
        return
    jsonl = JsonLines(cfg.metrics.metrics_file)
    jsonl.write(report.record())
    jsonl.close()
    for line in format_table(report).splitlines():
        log.info("%s", line)


def format_table(report: Report) -> str:
    """The report as text: one line per node check, one per collective and size."""
    out = [f"node check: {'PASSED' if report.passed else 'FAILED'} in {report.seconds:.1f} s, "
           f"{report.world_size} ranks on {report.nodes} node(s), sizes of {report.model}"]
    width = max([len(r["node"]) for r in report.results] + [4])
    out.append(f"  {'node':<{width}}  {'check':<16} {'result':<8} figure")
    out += [f"  {r['node']:<{width}}  {r['check']:<16} "
            f"{STATUS[r['ok']]:<8} {r['figure']}"
            for r in report.results]
    out.append(f"  {'collective':<11} {'unit':<6} {'MB':>10} {'time ms':>9} {'algbw GB/s':>11} "
               f"{'busbw GB/s':>11}  slowest rank (node)")
    for where, rows in (("all ranks", report.bandwidth), ("per node", report.node_bandwidth)):
        if rows and where == "per node":
            out.append("  inside each node:")
        out += [f"  {r['collective']:<11} {r['unit']:<6} {r['bytes'] / 1e6:>10,.3f} "
                f"{r['seconds'] * 1e3:>9.3f} {r['algbw_gbs']:>11.2f} {r['busbw_gbs']:>11.2f}  "
                f"{r['slowest_rank']} ({r.get('node', r['slowest_node'])})" for r in rows]
    t = report.transport
    out.append(f"  transport: {t['transport']} ({t['how']})")
    if "log" in t:
        out.append(f"  NCCL's log: {t['log']} (rank 0; every rank writes its own, as "
                   "NCCL_DEBUG_FILE names it)")
    out += [f"  FAILED {f}" for f in report.failures]
    return "\n".join(out)


# ----------------------------------------------------------------------------- on its own
def main(argv: list[str] | None = None) -> int:
    """``python -m training.node_check <the fine-tune's flags>``: only the check."""
    cfg = parse_args(argv)
    # The standalone command always checks, whatever --node-check says.
    cfg = dataclasses.replace(cfg, node_check=dataclasses.replace(cfg.node_check, node_check=True))
    nccl_log_defaults(cfg, os.environ)  # before NCCL starts: it reads them once
    env = init_distributed(cfg.parallel.collective_timeout_s)
    setup_logging(env)
    try:
        check_job(cfg, env)
        return 0
    except NodeCheckFailed as e:
        if env.is_main:
            log.error("%s", e)
        return 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
