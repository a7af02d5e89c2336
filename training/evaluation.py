"""Evaluation: the mean token loss over the whole validation set, and when to compute it."""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist
from torch import nn

from training.dataset import IGNORE_INDEX, PackedData, StepSampler, eval_rows
from training.dist import DistEnv, batch_to_device
from training.metrics import eval_metrics

log = logging.getLogger("training")


def evaluate(model: nn.Module, val: PackedData, batch_size: int, env: DistEnv) -> tuple[float,
                                                                                      int]:
    """(mean token loss, target tokens) over the whole validation set: every rank takes every
    world-th row, sums its token losses and counts, and one all-reduce adds them up, so the
    result does not depend on the world size. Eval mode (no dropout), no gradients."""
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=env.device)
    with torch.no_grad():
        for rows in eval_rows(len(val), env.world_size, env.rank, batch_size):
            index = torch.tensor(rows).clamp(min=0)
            labels = val.targets[index].masked_fill(torch.tensor(rows)[:, None] < 0, IGNORE_INDEX)
            inputs, _, *positions = val.batch(index)
            batch = (inputs, labels, *positions)
            sums[0] += model(*batch_to_device(batch, env.device)).double()
            sums[1] += (labels != IGNORE_INDEX).sum().item()
    dist.all_reduce(sums)
    model.train()
    return float(sums[0] / sums[1].clamp(min=1)), int(sums[1])


class Evaluator:
    """The validation set, its cadence (every ``every`` steps, or with 0 at the end of every
    epoch; always after the last step) and this process's evaluation records, in order."""

    def __init__(self, val: PackedData | None, batch_size: int, every: int,
                 sampler: StepSampler, env: DistEnv):
        self.val, self.batch_size, self.every = val, batch_size, every
        self.sampler, self.env = sampler, env
        self.records: list[dict] = []

    def due(self, step: int, last: int, offset: int) -> bool:
        """Whether ``step`` (leaving the data at ``offset`` of its epoch) is evaluated."""
        return self.val is not None and (step == last or (
            step % self.every == 0 if self.every else self.sampler.epoch_done(offset)))

    def __call__(self, model: nn.Module, step: int, epoch: int) -> dict:
        """Evaluate now; the record (also kept in ``records``)."""
        started = time.perf_counter()
        loss, tokens = evaluate(model, self.val, self.batch_size, self.env)
        self.records.append(eval_metrics(step=step, epoch=epoch, loss=loss, tokens=tokens,
                                         eval_time_s=time.perf_counter() - started))
        return self.records[-1]
