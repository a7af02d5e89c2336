"""Fault injection for the tests, behind one seam: `from_environment()` is None unless a
``FSDP_EKS_TEST_*`` variable is set, and the job then passes the result to the three places that
take hooks (a point in the setup, the loop's step end, the checkpointer's files-written point). A production run
builds no `Faults` and runs no hook code.

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
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass

from training.dist import DistEnv

log = logging.getLogger(__name__)

STEP_DELAY_ENV = "FSDP_EKS_TEST_STEP_DELAY_S"
SETUP_PAUSE_ENV = "FSDP_EKS_TEST_SETUP_PAUSE_S"
EXIT_AFTER_STEP_ENV = "FSDP_EKS_TEST_EXIT_AFTER_STEP"
KILL_IN_SAVE_ENV = "FSDP_EKS_TEST_KILL_IN_SAVE_AT_STEP"
FAIL_WHEN_SIGNALLED_ENV = "FSDP_EKS_TEST_FAIL_WHEN_SIGNALLED"


@dataclass(frozen=True)
class Faults:
    """The faults a test asked for (the module docstring)."""

    env: DistEnv
    step_delay_s: float = 0.0
    setup_pause_s: float = 0.0
    exit_after_step: int = 0
    kill_in_save_at_step: int = 0
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
        return False

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
                                                 FAIL_WHEN_SIGNALLED_ENV)):
        return None
    return Faults(env, step_delay_s=float(os.environ.get(STEP_DELAY_ENV) or 0),
                  setup_pause_s=float(os.environ.get(SETUP_PAUSE_ENV) or 0),
                  exit_after_step=int(os.environ.get(EXIT_AFTER_STEP_ENV) or 0),
                  kill_in_save_at_step=int(os.environ.get(KILL_IN_SAVE_ENV) or 0),
                  fail_when_signalled=os.environ.get(FAIL_WHEN_SIGNALLED_ENV) == "1")
