"""Stop on SIGTERM at the next step boundary, with a checkpoint of that step.

Kubernetes ends a pod (a node drained, a Spot or capacity-block instance reclaimed, the job
deleted) with SIGTERM to the container's first process, here torchrun, and SIGKILL after the
pod's grace period (30 s by default). torchrun's agent answers SIGTERM by sending SIGTERM to its
workers and waiting up to its shutdown timeout (30 s) before SIGKILL. Left to Python's default,
a worker dies at once and the steps since the last checkpoint are lost.

`TerminationRequest` is installed in every worker before its first collective (the
rendezvous), so no rank meets SIGTERM with Python's default action while another already
handles it (before, a rank whose handler was not yet installed died outright and its peer
failed with a connection reset traceback). During the setup (data, node check, model, resume)
there is no progress to save: SIGTERM raises `Terminated` at once on the rank that gets it, and
the worker exits with `EXIT_CODE` and one line. Once the loop starts (`defer`), SIGTERM only
sets a flag. Every step carries the flag summed over the ranks (one tiny all-reduce queued
behind the step, read with the step's loss: training/step_queue.py), so every rank learns at the
same step whether any of them was asked to stop, and a node reclaimed alone stops every rank at
the same step. The loop reads a step while the next one runs, so it stops after the step queued
when it reads the flag, one or two steps after the signal; it saves that step's checkpoint
(unless it just saved it), completes it, and the process exits with `EXIT_CODE` (128 + SIGTERM,
as a process killed by it): torchrun, the PyTorchJob's restart policy or the next submission
starts again from that step. An error on a rank that was sent SIGTERM (a peer that stopped
first, a collective cut short) ends the same way: the signal is the cause, not the error.

torchrun itself re-raises the signal as a traceback and exits 1: training/launch.py is torchrun
ending with one line and 128 + the signal, what the job's pods run.

The save has to fit in what is left of both 30 s windows after the step in flight ends; a
larger model state per rank than a checkpoint can write in that time loses the steps since the
last regular checkpoint, as without this (docs/performance.md has the save's cost per GiB).
"""

from __future__ import annotations

import logging
import signal

log = logging.getLogger(__name__)

EXIT_CODE = 128 + signal.SIGTERM
"""The worker's exit status after stopping on SIGTERM (143): a failure to torchrun and to the
PyTorchJob's restart policy, so the job resumes instead of counting as done."""


class TerminationRequest:
    """SIGTERM sets `signalled` while installed, and until `defer` also raises `Terminated`
    (see the module docstring). A context manager: the previous handler is restored on exit."""

    def __init__(self) -> None:
        self.signalled = False
        self.deferred = False
        self._previous = None

    def _handler(self, signum, frame) -> None:
        first = not self.signalled
        self.signalled = True
        if first and not self.deferred:
            raise Terminated(None, saved=False)

    def defer(self) -> None:
        """From now on (the loop), SIGTERM only sets `signalled`; the loop stops at the next
        step boundary that every rank agrees on."""
        self.deferred = True

    def __enter__(self) -> TerminationRequest:
        self._previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        # None: the previous handler was not set from Python; the default is what stood.
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)


class Terminated(Exception):
    """The run stopped at `step` on SIGTERM (None: before the first step); `saved`: with a
    complete checkpoint of it."""

    def __init__(self, step: int | None, saved: bool):
        super().__init__(step, saved)
        self.step, self.saved = step, saved

    def __str__(self) -> str:
        if self.step is None:
            return ("stopped on SIGTERM before the first step: nothing to save yet; a restarted "
                    "job starts the setup again")
        where = (f"its checkpoint is complete, and a restarted job resumes after it"
                 if self.saved else "no --checkpoint-dir, so nothing was saved")
        return f"stopped after step {self.step} on SIGTERM: {where}"
