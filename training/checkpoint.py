"""One checkpointer: torch.distributed.checkpoint (DCP), complete-only, any world size.

Layout of --checkpoint-dir (a filesystem every node sees, e.g. FSx for Lustre)::

    step_00000100/           a complete checkpoint: DCP shards, .metadata, COMPLETE
    .step_00000200.tmp/      a save in progress (or one that died): never resumed

Save protocol: every rank writes its shards into the temporary directory (`dcp.save`); after a
barrier, rank 0 writes the COMPLETE marker, fsyncs, and renames the directory to its final name
in one atomic rename. A process killed at any point before that rename leaves only a `.tmp`
directory, which resume ignores and the next save deletes. Resume picks the newest directory
that has the marker. Parameters and optimizer states are saved as DTensors with their global
shapes, so DCP reshards them when the next run has a different world size.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                     get_optimizer_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.checkpoint.stateful import Stateful

from training.dist import DistEnv

log = logging.getLogger(__name__)

STEP_PREFIX = "step_"
TMP_SUFFIX = ".tmp"
COMPLETE_MARKER = "COMPLETE"
MODEL_KEY, OPTIMIZER_KEY, TRAINER_KEY = "model", "optimizer", "trainer"
EVAL_LOSS_KEY = "eval_loss"
"""Key of the validation loss in a COMPLETE marker, when the step was evaluated (--keep-best)."""

TEST_KILL_IN_SAVE_ENV = "FSDP_EKS_TEST_KILL_IN_SAVE_AT_STEP"
"""Test hook: on the first attempt (TORCHELASTIC_RESTART_COUNT=0), the last rank SIGKILLs itself
after writing its shards of this step's checkpoint, before the checkpoint is marked complete."""


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


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under root, oldest first."""
    found = []
    if root.is_dir():
        for path in root.iterdir():
            name = path.name
            if (name.startswith(STEP_PREFIX) and name[len(STEP_PREFIX):].isdigit()
                    and (path / COMPLETE_MARKER).is_file()):
                found.append((int(name[len(STEP_PREFIX):]), path))
    return sorted(found)


def best_checkpoint(root: Path) -> tuple[int, Path, float] | None:
    """(step, path, validation loss) of the complete checkpoint with the lowest validation loss
    recorded in its marker (the newest among equals); None if none records one."""
    scored = []
    for step, path in complete_checkpoints(root):
        loss = json.loads((path / COMPLETE_MARKER).read_text() or "{}").get(EVAL_LOSS_KEY)
        if loss is not None:
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


class Checkpointer:
    """Save and load the whole training state; keep the newest K complete checkpoints (and,
    with keep_best, the one with the lowest validation loss)."""

    def __init__(self, root: str, keep: int, env: DistEnv, keep_best: bool = False):
        self.root, self.keep, self.env, self.keep_best = Path(root), keep, env, keep_best
        if env.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
        dist.barrier()

    def _state(self, model, optimizer, trainer: TrainerState) -> dict:
        return {MODEL_KEY: ModelState(model), OPTIMIZER_KEY: OptimizerState(model, optimizer),
                TRAINER_KEY: trainer}

    def latest(self) -> Path | None:
        """The newest complete checkpoint, as rank 0 sees it (all ranks get the same answer)."""
        found = complete_checkpoints(self.root) if self.env.is_main else []
        choice = [found[-1][1] if found else None]
        dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def load(self, path: Path, model, optimizer, trainer: TrainerState) -> None:
        dcp.load(self._state(model, optimizer, trainer), checkpoint_id=str(path))

    def best(self) -> tuple[int, Path, float] | None:
        """`best_checkpoint` as rank 0 sees it (all ranks get the same answer)."""
        choice = [best_checkpoint(self.root) if self.env.is_main else None]
        dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def load_model(self, path: Path, model) -> None:
        """Only the model's weights of a checkpoint (e.g. the best one, to export it)."""
        dcp.load({MODEL_KEY: ModelState(model)}, checkpoint_id=str(path))

    def save(self, step: int, model, optimizer, trainer: TrainerState, extra: dict) -> Path:
        final = self.root / step_dir_name(step)
        tmp = self.root / f".{final.name}{TMP_SUFFIX}"
        started = time.perf_counter()
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        dcp.save(self._state(model, optimizer, trainer), checkpoint_id=str(tmp))
        _maybe_die_for_test(step, self.env)
        dist.barrier()  # every rank's shards are written
        if self.env.is_main:
            marker = tmp / COMPLETE_MARKER
            with marker.open("w") as f:
                json.dump({"step": step, "world_size": self.env.world_size,
                           "unix_time": time.time(), **extra}, f)
                f.flush()
                os.fsync(f.fileno())
            if final.exists():  # the same step saved before a restart; replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            self._prune()
        log.info("saved checkpoint %s in %.1f s", final, time.perf_counter() - started)
        return final

    def _prune(self) -> None:
        """Delete all but the newest K complete checkpoints (and the best, with keep_best), and
        stale partial ones."""
        best = best_checkpoint(self.root) if self.keep_best else None
        for _, path in complete_checkpoints(self.root)[:-self.keep]:
            if best is None or path != best[1]:
                shutil.rmtree(path, ignore_errors=True)
        for path in self.root.glob(f".{STEP_PREFIX}*{TMP_SUFFIX}"):
            shutil.rmtree(path, ignore_errors=True)


def _maybe_die_for_test(step: int, env: DistEnv) -> None:
    if (os.environ.get(TEST_KILL_IN_SAVE_ENV) == str(step)
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            and env.rank == env.world_size - 1):
        log.warning("test hook %s: rank %d dies while saving step %d", TEST_KILL_IN_SAVE_ENV,
                    env.rank, step)
        os.kill(os.getpid(), signal.SIGKILL)
