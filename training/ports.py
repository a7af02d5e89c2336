"""A free TCP port on loopback: the rendezvous of a run without torchrun, and the tests' own
servers (a real etcd, the metrics endpoint). Plain socket code, no torch, so the tests of the
program import it without the training stack."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on the loopback interface that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
