"""One checkpointer: torch.distributed.checkpoint (DCP), complete-only, verified, any world size.

Layout of --checkpoint-dir (a filesystem every node sees, e.g. FSx for Lustre)::

    step_00000100/           a complete checkpoint: DCP shards, .metadata, MANIFEST.json,
                             RUN.json (the run's settings), COMPLETE
    .step_00000200.tmp/      a save in progress (or one that died): never resumed
    damaged.step_00000300.<time>/   a checkpoint that failed verification, set aside, never resumed

Save protocol: every rank writes its shards into the temporary directory (DCP names them
``__<rank>_<n>.distcp``; rank 0 also writes ``.metadata``), in the background with
``--async-checkpoint`` (``dcp.async_save``: the step waits only for the copy to host memory).
When a rank's files are written it checksums them; once every rank is done (checked with one
tiny collective per step while a save is pending, and waited for before the next save and at
the end), the sizes and checksums are gathered to rank 0, which writes RUN.json, then
MANIFEST.json (the size and CRC32 of every file of the checkpoint, RUN.json included; its
``unlisted`` key says why the two files it cannot list are not in it), then the COMPLETE marker
(holding the manifest's own checksum), fsyncs, and renames the directory to its final name in
one atomic rename. A process killed at any point before that rename leaves only a
`.tmp` directory, which resume ignores and the next save deletes.

Resume (``Checkpointer.resume``) takes the newest complete checkpoint, compares the run that
wrote it (its RUN.json, checked against the manifest first) with this one before reading any
shard (a changed data order is refused there, training/run_record.py), verifies it (every file
of the manifest present with its size and CRC32; the work is split over the ranks, so each rank
reads about 1/world of the checkpoint once), and loads it. A checkpoint that fails, whose RUN.json does not match the manifest or is
not a run record, or whose DCP load fails without a manifest to vouch for it, is moved aside as
``damaged.*`` with a warning naming what is wrong, and the next older complete one is tried:
a run never starts from step 0 while a sound checkpoint exists. A checkpoint that verifies but
does not load is not damaged: the model or config differs from the run that wrote it, which is
the user's to fix (an error, nothing moved); so is a file or directory of the checkpoint this
process cannot read (permissions, an I/O error: an error naming it on every rank, nothing
moved). Every decision is taken from collectives, so it is the same on all ranks.

A checkpoint written before RUN.json was listed in the manifest (a manifest that does not list
it) still resumes: its RUN.json is compared as it is, with a warning that
nothing vouches for it. Setting such checkpoints aside would restart long runs from step 0 for
a file that is, in all likelihood, sound; the record's shape is still checked, and its shards
are verified as before.

Checksum: CRC32 (zlib, in the standard library; 2.8 GiB/s on one core of this repository's CI
machine against 0.58 GiB/s for SHA-256; it releases the GIL, so hashing in the background
thread does not stall the step). It guards against truncated, missing and bit-rotted files,
not against tampering. Parameters and optimizer states are saved as DTensors with their global
shapes, so DCP reshards them when the next run has a different world size.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import random
import shutil
import stat
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.checkpoint.stateful import Stateful

from training.dist import DistEnv
from training.errors import UserError
from training.config import JobConfig
from training.run_record import compare, data_fingerprint, record_problem, run_record

log = logging.getLogger(__name__)
T = TypeVar("T")

STEP_PREFIX = "step_"
TMP_SUFFIX = ".tmp"
DAMAGED_PREFIX = "damaged."
COMPLETE_MARKER = "COMPLETE"
MANIFEST = "MANIFEST.json"
RUN_RECORD = "RUN.json"
"""What the run that wrote a checkpoint was started with (training/run_record.py)."""
UNLISTED = {
    MANIFEST: f"its own CRC32 is in {COMPLETE_MARKER}",
    COMPLETE_MARKER: "written after the manifest, as the last file; it holds the manifest's CRC32",
}
"""The files of a complete checkpoint its manifest cannot list, and why (written into it)."""
DCP_METADATA = ".metadata"
MODEL_KEY, OPTIMIZER_KEY, TRAINER_KEY = "model", "optimizer", "trainer"
EVAL_LOSS_KEY = "eval_loss"
"""Key of the validation loss in a COMPLETE marker, when the step was evaluated (--keep-best)."""
CHUNK = 16 << 20
"""Bytes read at a time when checksumming."""

class ModelState(Stateful):
    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict) -> None:
        set_model_state_dict(self.model, state_dict)


class OptimizerState(Stateful):
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


class TrainerState(Stateful):
    """Progress that is not a tensor of the model: step, data position, schedule, RNG.

    Every rank holds the same values (data order and RNG are seeded identically on all ranks),
    so DCP stores one copy, which loads on any world size.
    """

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler):
        self.scheduler = scheduler
        self.step = 0
        self.epoch = 0
        self.offset = 0
        """Packed sequences of this epoch's order already consumed."""
        self.tokens_seen = 0

    def state_dict(self) -> dict:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        return {"step": self.step, "epoch": self.epoch, "offset": self.offset,
                "tokens_seen": self.tokens_seen, "scheduler": self.scheduler.state_dict(),
                "rng": rng}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step, self.epoch = state_dict["step"], state_dict["epoch"]
        self.offset, self.tokens_seen = state_dict["offset"], state_dict["tokens_seen"]
        self.scheduler.load_state_dict(state_dict["scheduler"])
        rng = state_dict["rng"]
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a regular file; PermissionError where this process may not look
    (``Path.is_file`` answers False there from Python 3.13 on, as if it were missing)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _unreadable(e: OSError) -> str:
    """The refusal for a checkpoint file this process cannot read: the checkpoint is not
    damaged (nothing is set aside); its permissions, or the file system it is on (an I/O
    error, a lost mount), are the user's to fix."""
    if isinstance(e, PermissionError):
        return (f"--checkpoint-dir: this process (uid {os.geteuid()}) cannot read {e.filename} "
                f"({e.strerror}); make the checkpoint directory readable by the job's user "
                "(chmod -R u+rX, or chown -R), or give another --checkpoint-dir")
    return (f"--checkpoint-dir: reading {e.filename} failed ({e.strerror or e}); check the file "
            "system it is on (a lost or failing mount), then start the run again")


def _step_dirs(root: Path) -> list[tuple[int, Path, bool]]:
    """(step, path, complete) of every ``step_<n>`` entry under root, oldest first; complete:
    it has its COMPLETE marker."""
    found = []
    if root.is_dir():
        for path in root.iterdir():
            name = path.name
            if name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX):].isdigit():
                found.append((int(name[len(STEP_PREFIX):]), path,
                              _is_file(path / COMPLETE_MARKER)))
    return sorted(found)


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under root, oldest first."""
    return [(step, path) for step, path, complete in _step_dirs(root) if complete]


def read_marker(path: Path) -> tuple[dict | None, str | None]:
    """(the checkpoint's COMPLETE marker, None) or (None, what is wrong with it); a marker
    this process may not read raises PermissionError (not damage)."""
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text())
    except PermissionError:
        raise
    except (OSError, ValueError) as e:
        return None, f"{COMPLETE_MARKER} is unreadable ({e})"
    if not isinstance(marker, dict):
        return None, f"{COMPLETE_MARKER} is not a JSON object"
    return marker, None


def best_checkpoint(root: Path) -> tuple[int, Path, float] | None:
    """(step, path, validation loss) of the complete checkpoint with the lowest validation loss
    recorded in its marker (the newest among equals); None if none records one. A marker that
    cannot be read records none (resume sets such checkpoints aside; this only skips one that
    was damaged since), nor does a loss that is not a finite number (a diverged evaluation's
    NaN is no minimum: it compares false with everything)."""
    scored = []
    for step, path in complete_checkpoints(root):
        marker, problem = read_marker(path)
        if problem is not None:
            log.warning("checkpoint %s: %s; not a candidate for --keep-best", path, problem)
        loss = (marker or {}).get(EVAL_LOSS_KEY)
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            scored.append((loss, -step, path))
    if not scored:
        return None
    loss, neg_step, path = min(scored)
    return -neg_step, path, loss


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> None:
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def file_crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def rank_files(directory: Path, rank: int) -> list[Path]:
    """The files DCP's FileSystemWriter wrote for ``rank``: ``__<rank>_<n>.distcp``, and the
    global ``.metadata`` for the coordinator, rank 0 (torch/distributed/checkpoint/filesystem.py)."""
    files = sorted(directory.glob(f"__{rank}_*.distcp"))
    if rank == 0 and (directory / DCP_METADATA).is_file():
        files.append(directory / DCP_METADATA)
    return files


def manifest_entries(files: list[Path]) -> dict[str, dict]:
    """{name: {"bytes", "crc32"}} of files already written."""
    return {f.name: {"bytes": f.stat().st_size, "crc32": file_crc32(f)} for f in files}


def check_file(directory: Path, name: str, expected: dict) -> str | None:
    """What is wrong with one file of a checkpoint, or None; OSError (PermissionError, EIO)
    where this process cannot read it."""
    path = directory / name
    if not _is_file(path):
        return f"{name} is missing"
    size = path.stat().st_size
    if size != expected["bytes"]:
        return f"{name} has {size} bytes, the manifest says {expected['bytes']} (truncated or overwritten)"
    if file_crc32(path) != expected["crc32"]:
        return f"{name} does not match its CRC32 (corrupted)"
    return None


def read_manifest(path: Path) -> tuple[dict | None, str | None]:
    """(files by name, None), (None, what is wrong), or (None, None) for a checkpoint written
    before manifests existed (its COMPLETE marker names none)."""
    marker, problem = read_marker(path)
    if problem is not None:
        return None, problem
    if "manifest_crc32" not in marker:
        return None, None
    try:
        raw = (path / MANIFEST).read_bytes()
    except PermissionError:
        raise
    except OSError:
        return None, f"{MANIFEST} is missing"
    if zlib.crc32(raw) != marker["manifest_crc32"]:
        return None, f"{MANIFEST} does not match the CRC32 in {COMPLETE_MARKER} (corrupted)"
    return json.loads(raw)["files"], None


@dataclass
class _PendingSave:
    """A save whose files are being written (and then checksummed) in the background."""

    step: int
    tmp: Path
    final: Path
    extra: dict
    files: Future
    """This rank's {name: {"bytes", "crc32"}} once its files are written."""
    started: float


class Checkpointer:
    """Save and load the whole training state; keep the newest K complete checkpoints (and,
    with keep_best, the one with the lowest validation loss); say when a save is due.
    ``on_files_written(step)`` runs on each rank once its files of a save are written, before
    the checkpoint is complete (the tests' fault hook)."""

    def __init__(self, root: str, keep: int, env: DistEnv, *, async_save: bool = True,
                 timeout_s: float = 600.0, keep_best: bool = False, every: int = 0,
                 run_record: dict | None = None,
                 on_files_written: Callable[[int], None] | None = None):
        self.root, self.keep, self.env, self.every = Path(root), keep, env, every
        self.run_record, self.on_files_written = run_record, on_files_written
        self.async_save, self.timeout_s, self.keep_best = async_save, timeout_s, keep_best
        if env.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
        # DCP's own collectives (plans, write results) run in the background thread of an
        # async save: they get a gloo group of their own, so they never interleave with the
        # training step's collectives on the default group.
        self.save_group = dist.new_group(backend="gloo",
                                         timeout=datetime.timedelta(seconds=timeout_s))
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-hash")
        self.pending: _PendingSave | None = None
        dist.barrier()

    def due(self, step: int, last: int, evaluated: bool) -> bool:
        """Every ``every`` steps (0: never in between), after the last step, and with
        keep_best after every evaluation."""
        return bool(self.every and step % self.every == 0) or step == last or (
            evaluated and self.keep_best)

    def _state(self, model, optimizer, trainer: TrainerState) -> dict:
        return {MODEL_KEY: ModelState(model), OPTIMIZER_KEY: OptimizerState(model, optimizer),
                TRAINER_KEY: trainer}

    # ------------------------------------------------------------------------- resume
    def resume(self, model, optimizer, trainer: TrainerState) -> Path | None:
        """Load the newest sound checkpoint; set damaged ones aside. None: start from step 0."""
        listed = self._on_main(lambda: _step_dirs(self.root))
        found = [(step, path) for step, path, complete in listed if complete]
        for step, path, complete in listed:
            if not complete and step > max((s for s, _ in found), default=-1):
                log.warning("%s has no %s marker (a copy or a deletion that did not finish): "
                            "not a checkpoint, not resumed", path, COMPLETE_MARKER)
        if not found:
            log.info("no complete checkpoint in %s: starting from step 0", self.root)
        damaged: list[str] = []
        for step, path in reversed(found):
            problems = (self._compare_runs(step, path)
                        or self._verify_and_load(path, model, optimizer, trainer))
            if not problems:
                if damaged:
                    log.warning("resumed from step %d (%s) instead of the damaged checkpoint(s) "
                                "%s", step, path, "; ".join(damaged))
                self._set_aside_unreadable([p for s, p in found if s < step])
                return path
            older = [s for s, _ in found if s < step]
            aside = self._set_aside(path)
            damaged.append(f"step {step} ({', '.join(problems)})")
            log.warning("checkpoint %s is damaged: %s. Set aside as %s for inspection; %s",
                        path, "; ".join(problems), aside,
                        f"falling back to step {older[-1]}" if older else
                        "no older complete checkpoint: starting from step 0")
        return None

    def _verify_and_load(self, path: Path, model, optimizer, trainer: TrainerState) -> list[str]:
        """Verify the checkpoint and load it; [] when loaded, else what is damaged."""
        problems = self.verify(path)
        if problems is None:  # verified
            self._load_verified(path, model, optimizer, trainer)
            return []
        if not problems:  # no manifest (written before manifests): DCP's load is the check
            log.warning("checkpoint %s has no %s (an older version wrote it): loading it "
                        "unverified", path, MANIFEST)
            return self._try_load(path, model, optimizer, trainer)
        return problems

    def _compare_runs(self, step: int, path: Path) -> list[str]:
        """Compare the run that wrote ``path`` with this one (training/run_record.py): refuse
        a changed data order, warn of the other changes. Before the verification and the
        load, which read all of its shards (100+ GB on a large model), for a refusal. Returns
        [what is damaged] for a RUN.json that cannot be read, else []."""
        if self.run_record is None:
            return []
        old, problem = self.run_record_of(path)
        if problem is not None:
            return [problem]
        if old is None:
            log.warning("checkpoint %s has no %s (an older version wrote it): what this run "
                        "changes against it is not checked", path, RUN_RECORD)
            return []
        refused, warnings = compare(old, self.run_record, step)
        if refused:
            raise UserError(f"--checkpoint-dir {self.root}: cannot resume {path.name}: "
                            + "; ".join(refused))
        for warning in warnings:
            log.warning("resuming %s: %s", path.name, warning)
        return []

    def _set_aside_unreadable(self, older: list[Path]) -> None:
        """Set aside the older checkpoints whose marker or manifest cannot be read (what
        pruning and --keep-best read of them), with a warning: they could never be resumed.
        Their shards are verified only if one is resumed or exported."""
        found = self._on_main(lambda: [(path, problem) for path in older
                                       if (problem := read_manifest(path)[1]) is not None])
        for path, problem in found:
            log.warning("older checkpoint %s is damaged: %s. Set aside as %s for inspection",
                        path, problem, self._set_aside(path))

    def verify(self, path: Path) -> list[str] | None:
        """Problems of a checkpoint (same list on every rank); None when verified sound, []
        when it has no manifest to verify against. Each rank checks every world-th file."""
        manifest, problem = self._on_main(lambda: read_manifest(path))
        if problem is not None:
            return [problem]
        if manifest is None:
            return []
        names = sorted(manifest)
        refusal = None
        try:
            mine = [p for name in names[self.env.rank::self.env.world_size]
                    if (p := check_file(path, name, manifest[name])) is not None]
        except OSError as e:  # what this rank cannot read (missing files are check_file's)
            mine, refusal = [], _unreadable(e)
        everyone: list = [None] * self.env.world_size
        dist.all_gather_object(everyone, (mine, refusal))
        refusals = sorted(r for _, r in everyone if r is not None)
        if refusals:
            raise UserError(refusals[0])
        problems = sorted(p for ps, _ in everyone for p in ps)
        return problems or None

    def run_record_of(self, path: Path) -> tuple[dict | None, str | None]:
        """(the RUN.json of a checkpoint, None) as rank 0 reads it; (None, None) if it has none
        (a checkpoint of an older version); (None, what is wrong) if the manifest cannot be
        read, RUN.json does not match its entry there, or it cannot be read as a run record.
        A RUN.json the manifest does not list (an older version wrote it) is read with a
        warning. The same on every rank."""
        def read() -> tuple[dict | None, str | None]:
            manifest, problem = read_manifest(path)
            if problem is not None:
                return None, problem
            if manifest is not None and RUN_RECORD in manifest:
                problem = check_file(path, RUN_RECORD, manifest[RUN_RECORD])
                if problem is not None:
                    return None, problem
            elif manifest is not None and _is_file(path / RUN_RECORD):
                log.warning("checkpoint %s: its %s does not list %s (an older version wrote "
                            "it): the run record is compared unverified", path, MANIFEST,
                            RUN_RECORD)
            try:
                record = json.loads((path / RUN_RECORD).read_text())
            except FileNotFoundError:
                return None, None
            except PermissionError:
                raise
            except (OSError, ValueError) as e:
                return None, f"{RUN_RECORD} is unreadable ({e})"
            problem = record_problem(record)
            return (None, f"{RUN_RECORD} {problem}") if problem else (record, None)

        return self._on_main(read)

    def _on_main(self, read: Callable[[], T]) -> T:
        """``read()`` on rank 0, its result on every rank; a file there that this process
        cannot read is the same UserError on every rank (`_unreadable`), so that no rank waits
        for the broadcast until the collective timeout."""
        shared: list = [None, None]
        if self.env.is_main:
            try:
                shared[0] = read()
            except OSError as e:
                shared[1] = _unreadable(e)
        dist.broadcast_object_list(shared, src=0)
        if shared[1] is not None:
            raise UserError(shared[1])
        return shared[0]

    def best(self) -> tuple[int, Path, float] | None:
        """`best_checkpoint` as rank 0 sees it, once any pending save is complete (all ranks
        get the same answer)."""
        self.wait()
        return self._on_main(lambda: best_checkpoint(self.root))

    def load_model(self, path: Path, model) -> list[str]:
        """Only the model's weights of a checkpoint (the best one, to export it), after
        verifying its files; [] on success, else what is wrong (the same on every rank)."""
        return self.verify(path) or self._load_state(path, {MODEL_KEY: ModelState(model)})

    def _try_load(self, path: Path, model, optimizer, trainer: TrainerState) -> list[str]:
        """Load; [] on success, else what DCP said (the same on every rank)."""
        return self._load_state(path, self._state(model, optimizer, trainer))

    def _load_state(self, path: Path, state: dict) -> list[str]:
        """Load ``state``'s keys from the checkpoint; [] on success, else what DCP said (the
        same on every rank)."""
        error = None
        try:
            dcp.load(state, checkpoint_id=str(path))
        # CheckpointException derives from BaseException, not Exception (torch's api.py).
        except (CheckpointException, OSError, ValueError, RuntimeError) as e:
            error = f"DCP cannot load it: {_first_line(e)}"
        errors: list = [None] * self.env.world_size
        dist.all_gather_object(errors, error)
        return sorted({e for e in errors if e is not None})

    def _load_verified(self, path: Path, model, optimizer, trainer: TrainerState) -> None:
        problems = self._try_load(path, model, optimizer, trainer)
        if problems:
            raise UserError(
                f"checkpoint {path} is intact (every file matches its manifest) but does not "
                f"load into this job: {'; '.join(problems)}. The model or its configuration "
                "differs from the run that wrote it: use that run's settings, or a new "
                "--checkpoint-dir to start afresh.")

    def _set_aside(self, path: Path) -> Path:
        """Rename a damaged checkpoint so that it is never resumed nor pruned (rank 0)."""
        aside = path.with_name(f"{DAMAGED_PREFIX}{path.name}.{int(time.time())}")
        if self.env.is_main:
            os.rename(path, aside)
            _fsync_dir(self.root)
        dist.barrier()
        return aside

    # ------------------------------------------------------------------------- save
    def save(self, step: int, model, optimizer, trainer: TrainerState, extra: dict) -> Path:
        """Start saving ``step`` (after finishing any save still pending); with
        ``async_save`` False, or ``wait()``, it is complete on return."""
        self.wait()
        final = self.root / step_dir_name(step)
        tmp = self.root / f".{final.name}{TMP_SUFFIX}"
        started = time.perf_counter()
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        state = self._state(model, optimizer, trainer)
        if self.async_save:
            written = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self.save_group)
        else:
            dcp.save(state, checkpoint_id=str(tmp), process_group=self.save_group)
            written = Future()
            written.set_result(None)
        rank = self.env.rank

        def written_files() -> dict[str, dict]:
            written.result()
            return manifest_entries(rank_files(tmp, rank))

        files = self._hasher.submit(written_files)
        self.pending = _PendingSave(step=step, tmp=tmp, final=final, extra=extra, files=files,
                                    started=started)
        log.info("checkpoint %s: state staged in %.2f s%s", final, time.perf_counter() - started,
                 ", writing in the background" if self.async_save else "")
        if not self.async_save:
            self.wait()
        return final

    def poll(self) -> None:
        """Complete a pending save if every rank has written it (one tiny collective)."""
        if self.pending is None:
            return
        done = torch.tensor([int(self.pending.files.done())], dtype=torch.int32)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            self._commit()

    def wait(self) -> None:
        """Wait (at most the collective timeout) for the pending save, then complete it."""
        if self.pending is not None:
            self.pending.files.exception(timeout=self.timeout_s)  # raises TimeoutError if hung
            self._commit()

    def _commit(self) -> None:
        p, self.pending = self.pending, None
        mine = p.files.result()  # the writer's or hasher's exception, if any, fails this rank
        if self.on_files_written is not None:
            self.on_files_written(p.step)
        everyone: list = [None] * self.env.world_size
        dist.all_gather_object(everyone, mine)
        if self.env.is_main:
            manifest = {name: entry for files in everyone for name, entry in files.items()}
            if self.run_record is not None:
                _write_synced(p.tmp / RUN_RECORD, json.dumps(self.run_record, indent=1))
                manifest.update(manifest_entries([p.tmp / RUN_RECORD]))
            on_disk = {f.name for f in p.tmp.iterdir()}
            assert on_disk == set(manifest), f"unlisted or unwritten files: {on_disk ^ set(manifest)}"
            raw = json.dumps({"step": p.step, "files": manifest, "unlisted": UNLISTED}, indent=1,
                             sort_keys=True)
            _write_synced(p.tmp / MANIFEST, raw)
            _write_synced(p.tmp / COMPLETE_MARKER, json.dumps(
                {"step": p.step, "world_size": self.env.world_size, "unix_time": time.time(),
                 "manifest_crc32": zlib.crc32(raw.encode()), **p.extra}))
            if p.final.exists():  # the same step saved before a restart; replace it
                shutil.rmtree(p.final)
            os.rename(p.tmp, p.final)
            _fsync_dir(self.root)
            self._prune()
        log.info("saved checkpoint %s (%d files, %.1f GB) %.1f s after it started", p.final,
                 sum(len(f) for f in everyone),
                 sum(e["bytes"] for f in everyone for e in f.values()) / 1e9,
                 time.perf_counter() - p.started)

    def close(self) -> None:
        """Finish the pending save; stop the hashing thread."""
        self.wait()
        self._hasher.shutdown()

    def _prune(self) -> None:
        """Delete all but the newest K complete checkpoints (and the best, with keep_best), and
        stale partial ones."""
        best = best_checkpoint(self.root) if self.keep_best else None
        for _, path in complete_checkpoints(self.root)[:-self.keep]:
            if best is None or path != best[1]:
                shutil.rmtree(path, ignore_errors=True)
        for path in self.root.glob(f".{STEP_PREFIX}*{TMP_SUFFIX}"):
            shutil.rmtree(path, ignore_errors=True)


def checkpointer_for(cfg: JobConfig, env: DistEnv, data,
                     on_files_written: Callable[[int], None] | None) -> Checkpointer | None:
    """The run's checkpointer, its RUN.json made of ``cfg``, the world size and the packed
    training rows ``data`` (training/run_record.py); None, with a warning, without
    --checkpoint-dir."""
    c = cfg.checkpoint
    if not c.checkpoint_dir:
        log.warning("no --checkpoint-dir: a failure loses all progress of this run")
        return None
    record = run_record(cfg, env.world_size, data_fingerprint(data.inputs, data.targets))
    return Checkpointer(c.checkpoint_dir, c.keep_checkpoints, env, async_save=c.async_checkpoint,
                        timeout_s=cfg.parallel.collective_timeout_s, keep_best=c.keep_best,
                        every=c.checkpoint_every, run_record=record,
                        on_files_written=on_files_written)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"
