"""One run owns a checkpoint directory at a time: OWNER.json in it, written by global rank 0.

Two jobs that write one directory at once (two PyTorchJobs, a re-run on shared FSx while the
first still runs) overwrite each other's checkpoints and resume from each other's steps. So a
run takes the directory at start, before any data is read, and keeps a heartbeat (the file's
modification time, touched every HEARTBEAT_S by a background thread of rank 0) until it ends.

A second run is refused, naming the owner (host, pid, run id, start time, heartbeat age),
unless the owner is gone:
- the same job: torchrun's run id (``TORCHELASTIC_RUN_ID``, the PyTorchJob's rdzvId) is the
  owner's, so a restarted group of that job takes its own directory back at once;
- a dead process on this host (its pid is not running): a killed run outside torchrun;
- a heartbeat older than STALE_AFTER_S on any host: a killed job elsewhere (pids mean nothing
  across hosts and pods, and a shared file system has no notion of a dead writer).
A run that ends, well or with an error, removes the file; a killed one leaves it to those rules.
Creating the file is atomic (O_EXCL), also on Lustre; taking over a stale owner's file is not
(two runs started within the same moment on a stale directory could both take it).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import torch.distributed as dist

from training.dist import DistEnv
from training.errors import UserError

log = logging.getLogger(__name__)

OWNER_FILE = "OWNER.json"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0
"""Ten missed heartbeats: longer than any pause of a live rank 0's background thread."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _owner_summary(owner: dict, age: float) -> str:
    started = owner.get("started")
    try:  # gmtime(None) would be now
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(started)))
    except (TypeError, ValueError, OverflowError, OSError):  # absent or not a time
        started = "at an unknown time"
    return (f"host {owner.get('host')}, pid {owner.get('pid')}, run id {owner.get('run_id')}, "
            f"started {started}, last heartbeat {age:.0f} s ago")


class DirectoryOwner:
    """This run's claim on a checkpoint directory (rank 0 only); ``release`` ends it."""

    def __init__(self, directory: Path):
        self.path = directory / OWNER_FILE
        self.me = {"host": socket.gethostname(), "pid": os.getpid(),
                   "run_id": os.environ.get("TORCHELASTIC_RUN_ID"), "started": time.time(),
                   "token": uuid.uuid4().hex}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> None:
        """Own the directory, or raise UserError naming its live owner."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.me)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            self._take_over(text)
        else:
            with os.fdopen(fd, "w") as f:
                f.write(text)
        self._thread = threading.Thread(target=self._beat, name="owner-heartbeat", daemon=True)
        self._thread.start()

    def _take_over(self, text: str) -> None:
        unreadable = None
        try:
            owner = json.loads(self.path.read_text())
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:  # released meanwhile
            owner, age = {}, float("inf")
        except (OSError, ValueError) as e:  # being written, or damaged: its age decides
            owner, age, unreadable = {}, _age(self.path), str(e)
        if not isinstance(owner, dict):
            owner, unreadable = {}, f"a JSON {type(owner).__name__}, not an owner record"
        pid = owner.get("pid")
        same_job = self.me["run_id"] is not None and owner.get("run_id") == self.me["run_id"]
        dead_here = (owner.get("host") == self.me["host"] and isinstance(pid, int) and pid > 0
                     and not _alive(pid))
        if not (same_job or dead_here or age > STALE_AFTER_S):
            who = (f"another run owns it ({_owner_summary(owner, age)})" if unreadable is None
                   else f"its {OWNER_FILE} cannot be read ({unreadable}) and was written "
                   f"{age:.0f} s ago, so a run may be writing it")
            raise UserError(
                f"--checkpoint-dir {self.path.parent}: {who}; two runs writing one directory "
                "overwrite each other's checkpoints. Wait for it to end, stop it, or give this "
                "run another --checkpoint-dir (a killed run's claim lapses "
                f"{STALE_AFTER_S:.0f} s after its last heartbeat; delete {self.path} if no run "
                "uses the directory)")
        if owner and not same_job:
            log.warning("--checkpoint-dir %s: taking it over from a run that is gone (%s)",
                        self.path.parent, _owner_summary(owner, age))
        tmp = self.path.with_name(f".{OWNER_FILE}.{self.me['token']}")
        tmp.write_text(text)
        try:
            os.replace(tmp, self.path)
        except OSError as e:  # e.g. a directory of that name
            tmp.unlink()
            raise UserError(f"--checkpoint-dir {self.path.parent}: cannot replace {OWNER_FILE} "
                            f"({e.strerror}); delete {self.path}") from None

    def _ours(self) -> bool:
        try:
            return json.loads(self.path.read_text()).get("token") == self.me["token"]
        except (OSError, ValueError):
            return False

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            if self._ours():
                os.utime(self.path)
            else:
                log.error("--checkpoint-dir %s: %s was replaced by another run; this run no "
                          "longer owns the directory", self.path.parent, OWNER_FILE)
                return

    def release(self) -> None:
        self._stop.set()
        if self._ours():
            self.path.unlink(missing_ok=True)


def _age(path: Path) -> float:
    """Seconds since ``path`` was last written; a file gone meanwhile is infinitely old."""
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")


def own_checkpoint_dir(checkpoint_dir: str | None, env: DistEnv) -> None:
    """Take --checkpoint-dir for this run, on rank 0, before anything is read; every rank
    raises the same refusal. Released when the process exits, after a finished or a failed
    run (a killed run's claim lapses by this module's rules)."""
    if checkpoint_dir is None:
        return
    refusal: list = [None]
    if env.is_main:
        owner = DirectoryOwner(Path(checkpoint_dir).expanduser())
        try:
            owner.take()
            atexit.register(owner.release)
        except UserError as e:
            refusal[0] = str(e)
    dist.broadcast_object_list(refusal, src=0)
    if refusal[0] is not None:
        raise UserError(refusal[0])
