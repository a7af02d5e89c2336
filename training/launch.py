"""torchrun, ending on a signal the way its workers do: ``python -m training.launch <torchrun's
arguments>`` (what the job's pods and training/demo.sh run).

torchrun's agent answers SIGTERM (Kubernetes ending the pod), SIGINT, SIGHUP and SIGQUIT by
sending the same signal to its workers, waiting for them (its shutdown timeout, 30 s) and then
re-raising torch's ``SignalException`` out of its main function (torch 2.13:
torch/distributed/elastic/agent/server/api.py ``SimpleElasticAgent.run``,
torch/distributed/launcher/api.py ``launch_agent``, torch/distributed/run.py ``main``): Python
prints that traceback and the process exits 1, whatever the workers did. (Read in this
repository's torch 2.13; the GPU image's torch 2.11 is not installed here: ``SignalException``
is the class torch's elastic agent has raised since torch 1.9, and any other ending stays
torchrun's own.) Here the same
launcher runs, and that one exception ends it instead with one line naming the signal and
status 128 + the signal (143 for SIGTERM, 130 for SIGINT: Ctrl-C in a terminal, which reaches
the workers only through torchrun, since each runs in a session of its own), as the workers
exit after saving their step
(training/termination.py). Every other outcome (success, a failed worker, a usage error) is
torchrun's own.
"""

from __future__ import annotations

import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun


def main(argv: list[str] | None = None) -> int:
    try:
        torchrun(argv)
    except SignalException as e:
        name = signal.Signals(e.sigval).name
        print(f"torchrun: stopped by {name}, which it passed to the workers (each one's log says "
              f"what it saved); exit status {128 + e.sigval}", file=sys.stderr)
        return 128 + e.sigval
    return 0


if __name__ == "__main__":
    sys.exit(main())
