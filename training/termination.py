"""Stop on SIGTERM or SIGINT (or SIGHUP, SIGQUIT) at the next step boundary, with a checkpoint
of that step.

Kubernetes ends a pod (a node drained, a Spot or capacity-block instance reclaimed, the job
deleted) with SIGTERM to the container's first process, here torchrun, and SIGKILL after the
pod's grace period (30 s by default). A user who started the run in a terminal (`make demo`,
torchrun by hand) ends it with Ctrl-C: the terminal sends SIGINT to its foreground process
group, which holds torchrun but not the workers, since torchrun starts each worker in a session
of its own (``start_new_session=True``, torch 2.13:
torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py
``SubprocessHandler._popen``). torchrun's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT
alike (``TORCHELASTIC_SIGNALS_TO_HANDLE``'s default, torch/distributed/elastic/multiprocessing/
api.py ``PContext.start``): the signal raises ``SignalException`` carrying it, and
``SimpleElasticAgent.run`` (torch/distributed/elastic/agent/server/api.py) answers with
``_shutdown(e.sigval)``, which sends that same signal to each worker's process group
(``SubprocessContext._close``, ``SubprocessHandler.close``: ``os.killpg``) and SIGKILL to any
still there after its shutdown timeout (30 s). So each worker gets the user's SIGINT (or the
pod's SIGTERM) once, from torchrun. Left to Python's defaults, SIGTERM kills a worker at once
and SIGINT raises KeyboardInterrupt with a traceback on every rank; either way the steps since
the last checkpoint are lost.

A terminal that hangs up (the ssh session of a `make demo` closed) sends SIGHUP, and Ctrl-backslash
SIGQUIT, the same way, and torchrun passes those on alike; by default they killed each worker
(SIGQUIT with a core dump), losing the steps since the last checkpoint, so they stop the run too.
`TerminationRequest` handles the four (`STOP_SIGNALS`) the same way, installed in every worker
before its first collective (the rendezvous), so no rank meets a signal with Python's default
action while another already handles it (before, a rank whose handler was not yet installed died
outright and its peer failed with a connection reset traceback). During the setup (data, node
check, model, resume) there is no progress to save: the signal raises `Terminated` at once on the
rank that gets it, and the worker exits with one line and `exit_status` (128 + the signal: 143 for
SIGTERM, 130 for SIGINT, as a process killed by it). Once the loop starts (`defer`), the signal
only sets a flag. Every step carries the signal's number, the largest over the ranks (one tiny
all-reduce queued behind the step, read with the step's loss: training/step_queue.py), so every
rank learns at the same step whether any of them was asked to stop, and by which signal, and a node
reclaimed alone stops every rank at the same step. The loop reads a step while the next one runs,
so it stops after the step queued when it reads the flag, one or two steps after the signal; it
saves that step's checkpoint (unless it just saved it), completes it, and the process exits with
`exit_status`: a failure to torchrun and to the PyTorchJob's restart policy, so the job resumes
instead of counting as done, and the next start (the restart, the next submission, the user's next
command) resumes from that step. An error on a rank that was sent the signal (a peer that stopped
first, a collective cut short) ends the same way: the signal is the cause, not the error. A second
signal (Ctrl-C pressed again) changes nothing: the first one's stop is under way.

torchrun itself re-raises the signal as a traceback and exits 1: training/launch.py is torchrun
ending with one line and 128 + the signal, what the job's pods and training/demo.sh run.

The save has to fit in what is left of both 30 s windows after the step in flight ends; a
larger model state per rank than a checkpoint can write in that time loses the steps since the
last regular checkpoint, as without this (docs/performance.md has the save's cost per GiB).
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""The signals that stop the run at a step boundary: Kubernetes ending the pod, Ctrl-C, a
terminal hanging up, Ctrl-backslash (the four torchrun's agent passes to its workers)."""


def exit_status(signum: int) -> int:
    """The worker's exit status after stopping on ``signum``: 128 + the signal, as a process
    killed by it (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + signum


class TerminationRequest:
    """A signal of `STOP_SIGNALS` sets `signal` while installed, and until `defer` also raises
    `Terminated` (see the module docstring). A context manager: the previous handlers are
    restored on exit."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self.deferred = False
        self._previous: dict[signal.Signals, object] = {}

    @property
    def signalled(self) -> bool:
        return self.signal is not None

    def _handler(self, signum, frame) -> None:
        if self.signal is not None:  # a second signal: the first one's stop is under way
            return
        self.signal = signal.Signals(signum)
        if not self.deferred:
            raise Terminated(self.signal, None, saved=False)

    def defer(self) -> None:
        """From now on (the loop), a signal only sets `signal`; the loop stops at the next
        step boundary that every rank agrees on."""
        self.deferred = True

    def __enter__(self) -> TerminationRequest:
        self._previous = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        # None: the previous handler was not set from Python; the default is what stood.
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)


class Terminated(Exception):
    """The run stopped on `signal` at `step` (None: before the first step); `saved`: with a
    complete checkpoint of it."""

    def __init__(self, signum: int, step: int | None, saved: bool):
        super().__init__(signum, step, saved)
        self.signal, self.step, self.saved = signal.Signals(signum), step, saved

    @property
    def exit_status(self) -> int:
        return exit_status(self.signal)

    def __str__(self) -> str:
        name = self.signal.name
        if self.step is None:
            return (f"stopped on {name} before the first step: nothing to save yet; the next "
                    "start begins the setup again")
        where = ("its checkpoint is complete, and a start with the same --checkpoint-dir "
                 "resumes after it" if self.saved else "no --checkpoint-dir, so nothing was saved")
        return f"stopped after step {self.step} on {name}: {where}"
