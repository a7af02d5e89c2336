"""The node and fabric check (training/node_check.py): each check against files, directories
and binaries the test makes, the failing cases included; the bandwidth path with real gloo
processes through torchrun; a failing check stopping a fine-tune before training.

Checked against: nccl-tests' definition of bus bandwidth and a published all_reduce_perf row
(NVIDIA/nccl#527), NCCL's own connection lines from published logs (aws/aws-ofi-nccl#64,
aws/aws-k8s-tester#464), coreutils ``df`` for file system sizes, the Llama-2-7B config.json
(hidden 4096, intermediate 11008, 32 heads, 32 kv heads, vocab 32000) and the tiny preset's
config (training/tiny.py).
"""

from __future__ import annotations

import os
import resource
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.distributed_c10d import _world

from tests.training.conftest import (
    REPO,
    child_env,
    free_port,
    records_of,
    steps_of,
    torchrun_cmd,
    train,
)
from training import node_check as nc
from training.config import parse_args
from training.dist import init_distributed
from training.faults import HEALTHY_H100, FakeNvml
from training.shapes import SHAPES
from training.tiny import LLAMA_KWARGS

pytestmark = pytest.mark.timeout(240)

NODE = "ip-10-0-1-23.ec2.internal"
GIB = 2**30


def script(path: Path, body: str) -> str:
    """An executable shell script (a stand-in for a binary of the image)."""
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def figures(results: list[nc.Result]) -> dict[str, tuple[bool | None, str]]:
    return {r.check: (r.ok, r.figure) for r in results}


# ----------------------------------------------------------------------------- EFA
def make_devices(dev: Path, count: int) -> Path:
    (dev / "infiniband").mkdir(parents=True)
    for i in range(count):
        (dev / "infiniband" / f"uverbs{i}").touch()
    return dev


FI_INFO_EFA = "\n".join(f"echo 'provider: efa'; echo '    fabric: efa'; echo '    domain: rdmap{i}s0-rdm'"
                        for i in range(2))


def test_efa_devices_and_libfabric_provider_pass_when_all_are_there(tmp_path):
    dev = make_devices(tmp_path / "dev", 4)
    fi_info = script(tmp_path / "fi_info", FI_INFO_EFA)
    got = figures(nc.check_efa(NODE, 4, nc.efa_devices(dev), fi_info))
    assert got["efa devices"] == (True, "4 of 4 in /dev/infiniband")
    assert got["libfabric efa"] == (True, "fi_info -p efa: 2 efa endpoints")


def test_a_missing_efa_device_fails_with_the_count(tmp_path):
    dev = make_devices(tmp_path / "dev", 31)
    ok, figure = figures(nc.check_efa(NODE, 32, nc.efa_devices(dev), None))["efa devices"]
    assert (ok, figure) == (False, "31 of 32 in /dev/infiniband")


def test_libfabric_without_the_efa_provider_fails_with_its_error(tmp_path):
    dev = make_devices(tmp_path / "dev", 1)
    fi_info = script(tmp_path / "fi_info", "echo 'fi_getinfo: -61 (No data available)' >&2; exit 1")
    ok, figure = figures(nc.check_efa(NODE, 1, nc.efa_devices(dev), fi_info))["libfabric efa"]
    assert ok is False
    assert "exit 1" in figure and "No data available" in figure


def test_no_efa_required_is_not_a_failure(tmp_path):
    (tmp_path / "dev").mkdir()
    ok, figure = figures(nc.check_efa(NODE, 0, nc.efa_devices(tmp_path / "dev"), None))["efa devices"]
    assert ok is None and figure.startswith("0 found")


# ----------------------------------------------------------------------------- limits, GPUs
@pytest.mark.parametrize("soft, efa, ok", [
    (64 * 1024, 32, False),               # the 64 KiB default of containerd: EFA fails
    (resource.RLIM_INFINITY, 32, True),
    (64 * 1024, 0, True),                 # no EFA: nothing to pin
])
def test_locked_memory_is_checked_against_efa(soft, efa, ok):
    result = nc.check_locked_memory(NODE, soft, efa, mem_total=2 * 1024 * GIB)
    assert result.ok is ok
    assert result.figure.startswith("unlimited" if soft == resource.RLIM_INFINITY else "64 KiB")


def test_fewer_gpus_than_promised_fail_with_both_counts():
    assert nc.check_gpu_count(NODE, 8, 7).ok is False
    assert nc.check_gpu_count(NODE, 8, 7).figure == "7 of 8 GPUs"
    assert nc.check_gpu_count(NODE, 8, 8).ok is True


def test_gpu_health_names_the_gpu_with_uncorrectable_errors():
    nvml = FakeNvml([HEALTHY_H100, {**HEALTHY_H100, "ecc": 2}, {**HEALTHY_H100, "rows": [0, 1, 1, 0]}])
    got = figures(nc.check_gpu_health(NODE, nvml, 3))
    assert got["gpu 0 health"] == (True, "ECC 0, remapped rows 0")
    assert got["gpu 1 health"] == (False, "2 uncorrectable ECC errors")
    assert got["gpu 2 health"] == (False, "remapped rows pending a reset")


def test_a_fault_the_driver_latched_before_the_check_fails_the_gpu():
    """What a fault that ended the run leaves for the restart's check: the driver's recovery
    action (NVIDIA's "Error Recovery and Response Flags": set by uncorrectable errors until the
    GPU is reset), a GPU NVML reports lost (Xid 79) or needing a reset, a failed row remapping.
    A driver without the recovery-action field answers NOT_SUPPORTED in the field: left out."""
    nvml = FakeNvml([{**HEALTHY_H100, "recovery": 1}, {**HEALTHY_H100, "error": "NVML_ERROR_GPU_IS_LOST"},
                     {**HEALTHY_H100, "rows": [0, 3, 0, 1]}, {**HEALTHY_H100, "recovery": 0},
                     {**HEALTHY_H100, "error": "NVML_ERROR_RESET_REQUIRED"}, {**HEALTHY_H100, "recovery": 99}])
    got = figures(nc.check_gpu_health(NODE, nvml, 6))
    assert got == {"gpu 0 health": (False, "recovery action: GPU reset"),
                   "gpu 1 health": (False, "NVML: GPU is lost"),
                   "gpu 2 health": (False, "row remapping failed"),
                   "gpu 3 health": (True, "ECC 0, remapped rows 0"),
                   "gpu 4 health": (False, "NVML: GPU requires restart"),
                   "gpu 5 health": (False, "recovery action: 99")}
    [row] = [r for r in nc.check_gpu_health(NODE, nvml, 6) if r.check == "gpu 0 health"]
    assert row.values["recovery_action"] == 1


def test_an_nvml_error_that_is_not_the_gpus_fault_still_breaks_the_rows():
    """Only a lost GPU or one needing a reset is the GPU's failure; another NVML error while
    opening a GPU is the check's own (a ``node checks`` row, which quarantines nothing)."""
    nvml = FakeNvml([{**HEALTHY_H100, "error": "NVML_ERROR_NOT_SUPPORTED"}])
    with pytest.raises(FakeNvml.NVMLError):
        nc.check_gpu_health(NODE, nvml, 1)


def test_gpu_health_without_nvml_is_skipped_with_the_reason():
    (result,) = nc.check_gpu_health(NODE, None, 8)
    assert result.ok is None and "pynvml" in result.figure


# ----------------------------------------------------------------------------- /dev/shm
def df_bytes(path: Path) -> int:
    out = subprocess.run(["df", "-B1", "--output=size", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return int(out.split()[-1])


def test_shm_size_is_the_file_systems_size_as_df_reports_it(tmp_path):
    size_gib = df_bytes(tmp_path) / GIB
    result = nc.check_shm(NODE, tmp_path, min_gib=0.001)
    assert result.ok is True
    assert result.values["gib"] == pytest.approx(size_gib, rel=1e-6)


def test_a_small_shm_fails_with_its_size(tmp_path):
    size_gib = df_bytes(tmp_path) / GIB
    result = nc.check_shm(NODE, tmp_path, min_gib=size_gib * 2)
    assert result.ok is False
    assert result.figure.startswith(f"{size_gib:.1f} GiB")


# ----------------------------------------------------------------------------- Lustre
def fake_tree(tmp_path: Path, fstype: str, module: str | None) -> tuple[nc.Probe, Path]:
    """proc/self/mounts with the checkpoint file system mounted at <tmp>/fsx as ``fstype``;
    the Lustre module under sys/module or in proc/modules (``module``), or nowhere."""
    mount = tmp_path / "fsx"
    (mount / "runs").mkdir(parents=True)
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mounts").write_text(
        "overlay / overlay rw 0 0\n"
        f"10.0.1.5@tcp:/abcdefgh {mount.resolve()} {fstype} rw,flock,lazystatfs 0 0\n")
    (sys_root / "module").mkdir(parents=True)
    if module == "sys":
        (sys_root / "module" / "lustre").mkdir()
    (proc / "modules").write_text("lnet 700416 1 lustre, Live 0x0\n" +
                                  ("lustre 1044480 0 - Live 0x0\n" if module == "proc" else ""))
    return nc.Probe(proc=proc, sys=sys_root, nvml=None, fi_info=None), mount / "runs"


@pytest.mark.parametrize("module", ["sys", "proc"])
def test_lustre_module_found_where_the_kernel_lists_it(tmp_path, module):
    probe, ckpt = fake_tree(tmp_path, "lustre", module)
    result = nc.check_lustre(NODE, ckpt, probe)
    assert result.ok is True and result.figure.startswith("loaded")


def test_a_lustre_checkpoint_dir_without_the_module_fails(tmp_path):
    probe, ckpt = fake_tree(tmp_path, "lustre", None)
    result = nc.check_lustre(NODE, ckpt, probe)
    assert result.ok is False
    assert result.figure == f"not loaded ({(tmp_path / 'fsx').resolve()} is lustre)"


def test_no_lustre_needed_off_lustre(tmp_path):
    probe, ckpt = fake_tree(tmp_path, "xfs", None)
    result = nc.check_lustre(NODE, ckpt, probe)
    assert result.ok is None and result.figure.endswith("is xfs")


# ----------------------------------------------------------------------------- storage
def test_checkpoint_dir_throughput_is_measured_and_nothing_is_left(tmp_path):
    result = nc.check_storage(NODE, tmp_path / "ckpt", nbytes=8 * 2**20)
    assert result.ok is True
    assert result.values["write_mbs"] > 0 and result.values["read_mbs"] > 0
    assert list((tmp_path / "ckpt").iterdir()) == []


def test_an_unwritable_checkpoint_dir_fails_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = nc.check_storage(NODE, blocker / "ckpt", nbytes=2**20)
    assert result.ok is False
    assert result.figure.startswith(f"{blocker / 'ckpt'} is not writable")


def test_a_hung_check_fails_after_the_time_limit():
    started = time.monotonic()
    (result,) = nc._with_timeout(lambda: time.sleep(30) or [], 0.5, NODE)
    assert time.monotonic() - started < 10
    assert (result.ok, result.figure) == (False, "did not finish within 0.5 s")


# ----------------------------------------------------------------------------- figures
def test_bus_bandwidth_reproduces_a_published_nccl_tests_row():
    """NVIDIA/nccl#527, 1 x p4dn.24xlarge (8 ranks): 1073741824 B in 8142.6 us -> algbw 131.87,
    busbw 230.77 GB/s."""
    algbw, busbw = nc.bus_bandwidth("all_reduce", 1073741824, 8142.6e-6, 8)
    assert algbw == pytest.approx(131.87, abs=0.01)
    assert busbw == pytest.approx(230.77, abs=0.01)


def test_all_gather_bus_factor_is_n_minus_1_over_n():
    """nccl-tests doc/PERFORMANCE.md: all-gather busbw = algbw x (n-1)/n."""
    algbw, busbw = nc.bus_bandwidth("all_gather", 16 * 10**9, 1.0, 16)
    assert (algbw, busbw) == (16.0, 15.0)


def test_sizes_are_what_fsdp_moves_for_llama_2_7b():
    """From the model's config.json: a layer is q, k, v, o (4 x 4096^2) and gate, up, down
    (3 x 4096 x 11008) = 202,375,168 parameters; the root unit is the embedding and the head
    (2 x 32000 x 4096). Parameters gathered in bf16, gradients reduced in fp32."""
    sizes = {(c, u): n for c, u, n in nc.fsdp_sizes(SHAPES["llama2-7b"], param_bytes=2)}
    assert sizes == {("all_gather", "layer"): 202_375_168 * 2, ("all_reduce", "layer"): 202_375_168 * 4,
                     ("all_gather", "root"): 262_144_000 * 2, ("all_reduce", "root"): 262_144_000 * 4}


@pytest.mark.parametrize("line, transport", [
    ("ip-172-31-6-104:9922:9980 [1] NCCL INFO Channel 01 : 9[101d0] -> 0[101c0] [send] via NET/AWS Libfabric/0",
     "EFA"),
    # aws-ofi-nccl's plugin has been named "Libfabric" (ncclNetPlugin .name) since it dropped "AWS".
    ("ip-172-31-6-104:9922:9980 [1] NCCL INFO Channel 01/0 : 9[1] -> 0[0] [send] via NET/Libfabric/0/GDRDMA",
     "EFA"),
    ("multi-node-nccl-test-worker-0:22:28 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
     "socket"),
    ("ip-172-31-6-104:9922:9980 [1] NCCL INFO Channel 01 : 9[101d0] -> 8[101c0] via P2P/IPC/read",
     "inside the node"),
])
def test_transport_comes_from_ncclS_own_connection_lines(line, transport):
    assert nc.transport_of([line], "nccl", 16)["transport"] == transport


SOCKET_LINE = "worker-0:22:28 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"


@pytest.mark.parametrize("efa", [1, 4, 32])
def test_nccl_over_tcp_between_nodes_fails_wherever_efa_was_requested(efa):
    """Whatever the bandwidth floor (none on a profile without a published EFA figure): TCP
    between nodes where the pods have EFA devices is a broken fabric, named as such."""
    failures = nc.transport_failures(nc.transport_of([SOCKET_LINE], "nccl", 16), efa, nodes=2)
    assert len(failures) == 1 and "TCP sockets" in failures[0] and f"{efa} EFA" in failures[0]


@pytest.mark.parametrize("line, efa, nodes", [
    (SOCKET_LINE, 0, 2),  # no EFA requested: sockets are what was asked for
    (SOCKET_LINE, 4, 1),  # one node: nothing crosses the fabric
    ("x NCCL INFO Channel 01/0 : 9[1] -> 0[0] [send] via NET/Libfabric/0/GDRDMA", 4, 2),
])
def test_efa_or_no_inter_node_traffic_passes_the_transport_rule(line, efa, nodes):
    assert nc.transport_failures(nc.transport_of([line], "nccl", 16), efa, nodes) == []


def test_no_connection_line_is_reported_as_unknown_with_why(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    got = nc.transport_of(["NCCL INFO Bootstrap : Using eth0"], "nccl", 16)
    assert got["transport"] == "unknown" and "NCCL_DEBUG=WARN" in got["how"]


@pytest.mark.parametrize("pattern, expected", [
    ("/logs/nccl.%h.%p.log", "/logs/nccl.ip-10-0-1-7.4242.log"),
    ("/logs/%%h-%x.log", "/logs/%h-%x.log"),
])
def test_the_nccl_log_path_is_expanded_as_nccl_does(pattern, expected):
    """Checked against NVIDIA/nccl src/debug.cc (ncclDebugInit): %h is the host name up to its
    first dot, %p the pid, %% a percent sign, any other %x kept as written."""
    assert nc.nccl_debug_path(pattern, "ip-10-0-1-7.ec2.internal", 4242) == Path(expected)


FAKE_NCCL = """
import os, socket, sys
from training import node_check as nc
from training.config import parse_args
nc.nccl_log_defaults(parse_args(sys.argv[1:]), os.environ)
with nc.nccl_lines() as (lines, path):
    # what NCCL does at INFO (src/debug.cc): NCCL_DEBUG_FILE's %h (host up to its first dot)
    # and %p (pid) expanded, the file opened "w" and line-buffered; stdout without the variable
    target = os.environ.get("NCCL_DEBUG_FILE")
    if target:
        name = target.replace("%h", socket.gethostname().split(".")[0]).replace(
            "%p", str(os.getpid()))
        out = open(name, "w", buffering=1)
    else:
        out = sys.stdout
    for i in range(300):
        out.write(f"host:1:2 [0] NCCL INFO Channel {i:02d}/0 : 1[0] -> 0[0] [send] via "
                  "NET/AWS Libfabric/0/GDRDMA\\n")
    out.flush()
transport = nc.transport_of(lines, "nccl", 16)
print("TRANSPORT", transport["transport"], path)
"""


def test_the_standalone_checks_nccl_log_goes_to_a_file_not_the_terminal(tmp_path):
    """Checked against NCCL's own rule for NCCL_DEBUG_FILE (src/debug.cc), imitated by a
    process that writes 300 connection lines where NCCL would: with the standalone check's
    defaults the terminal gets none of them, the transport is still read from them (EFA),
    and they are all in the file beside --metrics-file that the check names (before:
    NCCL_DEBUG=INFO printed every line to the terminal, burying the table)."""
    out = subprocess.run([sys.executable, "-c", FAKE_NCCL, "--metrics-file",
                          str(tmp_path / "m.jsonl")], cwd=REPO, capture_output=True, text=True,
                         env={k: v for k, v in child_env().items()
                              if not k.startswith("NCCL_DEBUG")}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NCCL INFO" not in out.stdout + out.stderr, out.stdout[-2000:]
    [line] = [line for line in out.stdout.splitlines() if line.startswith("TRANSPORT")]
    _, transport, path = line.split(" ", 2)
    assert transport == "EFA" and Path(path).parent == tmp_path / nc.NCCL_LOG_DIR
    assert Path(path).read_text().count("NCCL INFO Channel") == 300


def test_a_users_own_nccl_debug_setting_stands(tmp_path):
    """Checked against the rule in nccl_log_defaults: NCCL_DEBUG set by the user (WARN, or INFO
    to the terminal) and NCCL_DEBUG_FILE of the user's own are left as they are."""
    cfg = parse_args(["--metrics-file", str(tmp_path / "m.jsonl")])
    for environ in ({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "INFO"},
                    {"NCCL_DEBUG_FILE": "/mine/%h.log"}):
        before = dict(environ)
        nc.nccl_log_defaults(cfg, environ)
        assert environ == ({**before, "NCCL_DEBUG": "INFO"} if "NCCL_DEBUG" not in before
                           else before)


def test_nccl_logs_go_to_the_temporary_directory_where_the_metrics_directory_cannot_hold_them(
        tmp_path, monkeypatch):
    """Checked against a --metrics-file under a path whose parent is a file (no directory can
    be made there, also as root): the NCCL log goes to the temporary directory instead of the
    check failing before it starts."""
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(nc.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    environ: dict = {}
    nc.nccl_log_defaults(parse_args(["--metrics-file", str(tmp_path / "file" / "m.jsonl")]),
                         environ)
    assert Path(environ["NCCL_DEBUG_FILE"]).parent == tmp_path / "tmp" / nc.NCCL_LOG_DIR


def test_the_table_names_the_nccl_log(tmp_path):
    """The table's transport line is followed by the file of rank 0's NCCL log, when the
    transport was read from one."""
    report = nc.Report(passed=True, seconds=1.0, model="llama2-7b", world_size=2, nodes=1,
                       results=[], bandwidth=[], node_bandwidth=[], slowest_rank=None,
                       slowest_node=None, failures=[],
                       transport={"transport": "EFA", "how": "NCCL connection lines",
                                  "log": "/fsx/nccl-logs/nccl.ip-1.42.log"})
    assert "  NCCL's log: /fsx/nccl-logs/nccl.ip-1.42.log (rank 0;" in nc.format_table(report)


# ----------------------------------------------------------------------------- real processes
def node_check_cmd(nproc: int, *flags: str) -> list[str]:
    return torchrun_cmd(nproc, module="training.node_check") + ["--model", "tiny", *flags]


def report_of(metrics: Path) -> dict:
    (record,) = [r for r in records_of(metrics) if "node_check/passed" in r]
    return {k.removeprefix("node_check/"): v for k, v in record.items()}


def test_two_ranks_measure_every_fsdp_size_over_gloo(tmp_path):
    """torchrun, 2 CPU ranks: per-node checks, and the all-reduce and all-gather at the tiny
    model's sizes (fp32 on CPU), as a table in the log and a record in the metrics file."""
    proc = subprocess.run(node_check_cmd(2, "--checkpoint-dir", str(tmp_path / "ckpt"),
                                         "--metrics-file", str(tmp_path / "m.jsonl")),
                          cwd=REPO, env=child_env(NODE_NAME=NODE), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = report_of(tmp_path / "m.jsonl")
    k = LLAMA_KWARGS
    kv = k["num_key_value_heads"] * k["hidden_size"] // k["num_attention_heads"]
    layer = (2 * k["hidden_size"] ** 2 + 2 * k["hidden_size"] * kv
             + 3 * k["hidden_size"] * k["intermediate_size"])
    root = 2 * k["vocab_size"] * k["hidden_size"]
    assert {(r["collective"], r["unit"], r["bytes"]) for r in report["bandwidth"]} == {
        ("all_gather", "layer", layer * 4), ("all_reduce", "layer", layer * 4),
        ("all_gather", "root", root * 4), ("all_reduce", "root", root * 4)}
    for row in report["bandwidth"]:
        assert row["busbw_gbs"] > 0 and row["slowest_node"] == NODE
        factor = 1.0 if row["collective"] == "all_reduce" else 0.5  # 2(n-1)/n, (n-1)/n at n=2
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * factor)
    assert report["passed"] and report["world_size"] == 2 and report["nodes"] == 1
    assert report["transport"]["transport"] == "gloo (TCP)"
    checks = {r["check"]: r for r in report["results"]}
    assert checks["checkpoint dir"]["ok"] and checks["checkpoint dir"]["values"]["write_mbs"] > 0
    assert "node check: PASSED" in proc.stderr and f"{NODE}  checkpoint dir" in proc.stderr


def test_a_bandwidth_floor_not_met_fails_naming_node_rank_and_figure(tmp_path):
    proc = subprocess.run(node_check_cmd(2, "--node-check-min-busbw-gbs", "1000000",
                                         "--metrics-file", str(tmp_path / "m.jsonl")),
                          cwd=REPO, env=child_env(NODE_NAME=NODE), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode != 0
    report = report_of(tmp_path / "m.jsonl")
    (failure,) = report["failures"]
    largest = max(r["bytes"] for r in report["bandwidth"] if r["collective"] == "all_reduce")
    assert failure.startswith(f"{NODE}: all-reduce bus bandwidth all ranks: ")
    assert f"at {largest / 1e6:,.1f} MB, below 1e+06 GB/s (slowest: rank " in failure
    assert failure in proc.stderr


def launch_ranks(nodes: list[str], per_node: int, *flags: str, tmp_path: Path,
                 entry: tuple[str, ...] = ("-m", "training.node_check")) -> list[subprocess.Popen]:
    """What torchrun gives the workers of a multi-node job, one process per rank, each node's
    ranks with that node's NODE_NAME (the pod's downward API value); ``entry``: how Python
    starts the check."""
    port, world = free_port(), len(nodes) * per_node
    procs = []
    for rank in range(world):
        env = child_env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_node),
                        LOCAL_WORLD_SIZE=str(per_node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                        NODE_NAME=nodes[rank // per_node])
        procs.append(subprocess.Popen(
            [sys.executable, *entry, "--model", "tiny",
             "--metrics-file", str(tmp_path / "m.jsonl"), *flags],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def test_two_nodes_are_measured_inside_each_node_and_the_slowest_named(tmp_path):
    procs = launch_ranks(["node-a", "node-b"], 2, "--node-check-min-node-busbw-gbs", "1000000",
                         tmp_path=tmp_path)
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs), outputs
    report = report_of(tmp_path / "m.jsonl")
    assert report["nodes"] == 2
    measured = {(r["node"], r["unit"]) for r in report["node_bandwidth"]}
    assert measured == {(n, u) for n in ("node-a", "node-b") for u in ("layer", "root")}
    slowest = report["slowest_node"]
    largest = max(r["bytes"] for r in report["node_bandwidth"])
    rows = [r for r in report["node_bandwidth"] if r["bytes"] == largest]
    assert slowest["node"] == min(rows, key=lambda r: r["busbw_gbs"])["node"]
    (failure,) = report["failures"]
    assert failure.startswith(f"{slowest['node']}: all-reduce bus bandwidth inside the node: ")


FED_NCCL_LOG = f"""
import sys
from training import node_check
# What NCCL prints where aws-ofi-nccl is not loaded: its connection lines, read by the check's own
# reader as on a GPU (gloo on the CPU prints none).
read = node_check.transport_of
node_check.transport_of = lambda lines, backend, ranks: read([*lines, {SOCKET_LINE!r}], "nccl", ranks)
sys.exit(node_check.main(sys.argv[1:]))
"""


def test_nccl_over_tcp_between_two_nodes_fails_the_whole_check_where_efa_was_requested(tmp_path):
    """The standalone check on two nodes (one CPU rank each) whose pods were given an EFA
    device, fed NCCL's connection line of a socket transport: the check's own path (main,
    check_job, the report) fails it with the transport named, whatever the bandwidth floor
    (none here), and says so in the log and the metrics file."""
    procs = launch_ranks(["node-a", "node-b"], 1, "--node-check-efa", "1", tmp_path=tmp_path,
                         entry=("-c", FED_NCCL_LOG))
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 1 for p in procs), outputs
    report = report_of(tmp_path / "m.jsonl")
    assert report["nodes"] == 2 and report["transport"]["transport"] == "socket"
    (failure,) = [f for f in report["failures"] if f.startswith("transport: ")]
    assert "NCCL used TCP sockets between nodes with 1 EFA device(s) per node" in failure
    assert "via NET/Socket" in failure and failure in outputs[0]


def test_a_failed_check_stops_the_fine_tune_before_training(tmp_path, tiny_cache):
    """The fine-tune with a node that lacks the EFA devices it was promised: status 1 after
    the checks that need no GPU (the data read) and before the model or any step, the node,
    the check and both counts named; the report is in the metrics file."""
    run = train(tmp_path, "--node-check-efa", "2", cache=tiny_cache, env={"NODE_NAME": NODE})
    assert run.returncode != 0
    assert f"{NODE}: efa devices: 0 of 2 in /dev/infiniband" in run.output
    assert "node check failed before training" in run.output
    assert steps_of(run.metrics_file) == {}
    assert "data: " in run.output and "model: " not in run.output and "step 1/" not in run.output
    assert report_of(run.metrics_file)["passed"] is False


def test_a_passing_check_is_reported_before_the_first_step(tmp_path, tiny_cache):
    run = train(tmp_path, "--max-steps", "1", "--checkpoint-dir", str(tmp_path / "ckpt"),
                cache=tiny_cache).check()
    records = records_of(run.metrics_file)
    assert "node_check/passed" in records[0] and records[0]["node_check/passed"] is True
    assert "train/step" in records[1]
    assert run.output.index("node check: PASSED") < run.output.index("step 1/")
    assert f"{socket.gethostname()}" in run.output


def test_no_node_check_skips_it(tmp_path, tiny_cache):
    run = train(tmp_path, "--max-steps", "1", "--no-node-check", "--node-check-efa", "2",
                cache=tiny_cache).check()
    assert "node check" not in run.output
    assert os.path.exists(run.metrics_file) and "node_check/passed" not in run.metrics_file.read_text()


@pytest.mark.parametrize("flags, passes", [([], True), (["--node-check-efa", "2"], False)],
                         ids=["passed", "failed"])
def test_the_check_leaves_no_process_group_of_its_own(flags, passes, world_of_one, tmp_path):
    """In a world of one (gloo): after a check that passed, and after one that failed (no EFA
    device of the 2 asked for in an empty device tree), the process groups are those from
    before the check: the training makes its own, and on GPUs each NCCL communicator the
    check kept would hold GPU memory for the whole run (before: the check's groups stayed)."""
    env = init_distributed(timeout_s=30)
    try:
        before = set(_world.pg_map)
        cfg = parse_args(["--model", "tiny", "--metrics-file", str(tmp_path / "m.jsonl"),
                          *flags])
        probe = nc.Probe(dev=tmp_path / "dev", shm=tmp_path, fi_info=None, nvml=None)
        if passes:
            assert nc.check_job(cfg, env, probe).passed
        else:
            with pytest.raises(nc.NodeCheckFailed, match="efa devices: 0 of 2"):
                nc.check_job(cfg, env, probe)
        assert set(_world.pg_map) == before
    finally:
        dist.destroy_process_group()
