"""Fault injection for the tests, behind one seam: `from_environment()` is None unless a
``FSDP_EKS_TEST_*`` variable is set, and the job then passes the result to the four places that
take hooks (a point in the setup, the node check's probe, the loop's step end, the
checkpointer's files-written point). A production run builds no `Faults` and runs no hook code.

- ``FSDP_EKS_TEST_STEP_DELAY_S``: sleep this many seconds after every step, so a test can act
  mid-run.
- ``FSDP_EKS_TEST_SETUP_PAUSE_S``: every rank sleeps this many seconds in the setup, after the
  checks that need no GPU (collectives among them), saying so first, so a test can act there.
- ``FSDP_EKS_TEST_EXIT_AFTER_STEP``: stop cleanly (status 0) right after this step and its
  checkpoint, like a job that was stopped; no final checkpoint or export.
- ``FSDP_EKS_TEST_FAIL_WHEN_SIGNALLED``: a rank that has been sent a stop signal
  (training/termination.py) raises an error at its next step end, before the loop reads the
  signal, as a collective cut short by a peer that stopped first would.
- ``FSDP_EKS_TEST_KILL_IN_SAVE_AT_STEP``: on the first attempt (TORCHELASTIC_RESTART_COUNT=0),
  the last rank SIGKILLs itself after writing its shards of this step's checkpoint, before the
  checkpoint is marked complete.
- ``FSDP_EKS_TEST_FAKE_NODE``: a directory standing for the node's hardware and pod: the node
  check reads its GPUs from ``gpus.json`` there (one object per GPU, `FakeNvml`'s readings,
  instead of the driver) and quarantines with the token and CA in ``serviceaccount/``.
- ``FSDP_EKS_TEST_GPU_FAULT_AT_STEP``: on the first attempt, at the end of this step, GPU 0 of
  the fake node reports an uncorrectable ECC error (recorded in ``gpus.json``, as the driver
  keeps its volatile counter until the GPU is reset) and rank 0 fails as CUDA fails a process
  whose memory was hit.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from training.dist import DistEnv
from training.node_check import Probe

log = logging.getLogger(__name__)

STEP_DELAY_ENV = "FSDP_EKS_TEST_STEP_DELAY_S"
SETUP_PAUSE_ENV = "FSDP_EKS_TEST_SETUP_PAUSE_S"
EXIT_AFTER_STEP_ENV = "FSDP_EKS_TEST_EXIT_AFTER_STEP"
KILL_IN_SAVE_ENV = "FSDP_EKS_TEST_KILL_IN_SAVE_AT_STEP"
FAKE_NODE_ENV = "FSDP_EKS_TEST_FAKE_NODE"
GPU_FAULT_ENV = "FSDP_EKS_TEST_GPU_FAULT_AT_STEP"
FAIL_WHEN_SIGNALLED_ENV = "FSDP_EKS_TEST_FAIL_WHEN_SIGNALLED"
CUDA_ECC_ERROR = "CUDA error: uncorrectable ECC error encountered"
"""What CUDA raises in a process whose GPU memory took an uncorrectable error
(``cudaErrorECCUncorrectable``'s text)."""


class FakeNvml:
    """NVML as nvidia-ml-py exposes it, for GPUs whose readings a test chooses: per GPU a dict of
    ``ecc`` (volatile uncorrectable count), ``pending`` (retired pages pending), ``pages``
    (retired pages), ``rows`` (remapped rows: correctable, uncorrectable, pending, failed) and
    optionally ``recovery`` (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) or ``error`` (what every call
    on the GPU raises: ``NVML_ERROR_GPU_IS_LOST``...). A reading given as None raises
    NOT_SUPPORTED, as on a GPU that does not expose it; a missing ``recovery`` answers
    NOT_SUPPORTED in its field value, as drivers without the field do."""

    NVML_SUCCESS = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        def __init__(self, value: int):
            super().__init__({3: "Not Supported", 15: "GPU is lost",
                              16: "GPU requires restart"}.get(value, f"NVML error {value}"))
            self.value = value

    def __init__(self, gpus: list[dict]):
        self.gpus = gpus

    def _get(self, h: int, key: str):
        gpu = self.gpus[h]
        if gpu.get("error"):
            raise self.NVMLError(getattr(self, gpu["error"]))
        if gpu[key] is None:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return gpu[key]

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.gpus[i].get("error"):
            raise self.NVMLError(getattr(self, self.gpus[i]["error"]))
        return i

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter): return self._get(h, "ecc")
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h): return self._get(h, "pending")
    def nvmlDeviceGetRetiredPages(self, h, cause): return self._get(h, "pages")
    def nvmlDeviceGetRemappedRows(self, h): return tuple(self._get(h, "rows"))

    def nvmlDeviceGetFieldValues(self, h, fields):
        action = self.gpus[h].get("recovery")
        return [SimpleNamespace(fieldId=f, nvmlReturn=self.NVML_ERROR_NOT_SUPPORTED
                                if action is None else self.NVML_SUCCESS,
                                value=SimpleNamespace(uiVal=action or 0)) for f in fields]

    def nvmlEventSetCreate(self): return []
    def nvmlDeviceRegisterEvents(self, h, kinds, events): pass
    def nvmlEventSetWait_v2(self, events, timeout_ms): raise self.NVMLError(10)  # TIMEOUT
    def nvmlEventSetFree(self, events): pass


HEALTHY_H100 = {"ecc": 0, "pending": None, "pages": None, "rows": [0, 0, 0, 0]}
"""Hopper remaps rows and does not retire pages: NVML says NOT_SUPPORTED for pages."""


@dataclass(frozen=True)
class Faults:
    """The faults a test asked for (the module docstring)."""

    env: DistEnv
    step_delay_s: float = 0.0
    setup_pause_s: float = 0.0
    exit_after_step: int = 0
    kill_in_save_at_step: int = 0
    fake_node: Path | None = None
    gpu_fault_at_step: int = 0
    fail_when_signalled: bool = False

    def in_setup(self) -> None:
        """In the setup, after the checks that need no GPU: pause, saying so on every rank."""
        if self.setup_pause_s:
            log.warning("test hook %s: rank %d pauses %g s in the setup", SETUP_PAUSE_ENV,
                        self.env.rank, self.setup_pause_s)
            time.sleep(self.setup_pause_s)

    def stop_after(self, step: int, signalled: bool) -> bool:
        """At the end of ``step``: sleep the delay; raise where this rank was ``signalled``
        and the test asked for a failure then; True where the run is to stop here."""
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if signalled and self.fail_when_signalled:
            raise RuntimeError(f"test hook {FAIL_WHEN_SIGNALLED_ENV}: rank {self.env.rank} fails "
                               f"at the end of step {step}, after its stop signal")
        if step == self.exit_after_step:
            log.warning("test hook %s: stopping after step %d", EXIT_AFTER_STEP_ENV, step)
            return True
        if (step == self.gpu_fault_at_step and self.env.rank == 0
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
            gpus = self.fake_gpus()
            gpus[0]["ecc"] += 1
            (self.fake_node / "gpus.json").write_text(json.dumps(gpus))
            log.warning("test hook %s: GPU 0 takes an uncorrectable ECC error in step %d",
                        GPU_FAULT_ENV, step)
            raise RuntimeError(CUDA_ECC_ERROR)
        return False

    def fake_gpus(self) -> list[dict]:
        """The fake node's GPUs as ``gpus.json`` holds them now."""
        return json.loads((self.fake_node / "gpus.json").read_text())

    def node_probe(self) -> Probe | None:
        """Where the node check looks on the fake node (None: the real node)."""
        if self.fake_node is None:
            return None
        gpus = self.fake_gpus()
        return Probe(dev=self.fake_node / "dev", nvml=FakeNvml(gpus), fi_info=None, gpus=len(gpus),
                     service_account=self.fake_node / "serviceaccount")

    def files_written(self, step: int) -> None:
        """A rank's checkpoint files of ``step`` are written, the checkpoint is not complete."""
        if (step == self.kill_in_save_at_step
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
                and self.env.rank == self.env.world_size - 1):
            log.warning("test hook %s: rank %d dies while saving step %d", KILL_IN_SAVE_ENV,
                        self.env.rank, step)
            os.kill(os.getpid(), signal.SIGKILL)


def from_environment(env: DistEnv) -> Faults | None:
    """The faults the environment asks for; None (no hooks at all) when it asks for none."""
    if not any(os.environ.get(name) for name in (STEP_DELAY_ENV, SETUP_PAUSE_ENV,
                                                 EXIT_AFTER_STEP_ENV, KILL_IN_SAVE_ENV,
                                                 FAKE_NODE_ENV, GPU_FAULT_ENV, FAIL_WHEN_SIGNALLED_ENV)):
        return None
    fake_node = os.environ.get(FAKE_NODE_ENV)
    return Faults(env, step_delay_s=float(os.environ.get(STEP_DELAY_ENV) or 0),
                  setup_pause_s=float(os.environ.get(SETUP_PAUSE_ENV) or 0),
                  exit_after_step=int(os.environ.get(EXIT_AFTER_STEP_ENV) or 0),
                  kill_in_save_at_step=int(os.environ.get(KILL_IN_SAVE_ENV) or 0),
                  fake_node=Path(fake_node) if fake_node else None,
                  gpu_fault_at_step=int(os.environ.get(GPU_FAULT_ENV) or 0),
                  fail_when_signalled=os.environ.get(FAIL_WHEN_SIGNALLED_ENV) == "1")
