"""The checkpoint carries the RNG streams: checked in one process (gloo world of one) through
the real Checkpointer (DCP save, complete marker, rename, DCP load).

The fine-tune draws nothing from the global RNGs during training today (data order and random
init use their own seeded generators), so the stop-and-resume loss test cannot see whether they
come back; this test does, against the draws the uninterrupted process makes after the save."""

from __future__ import annotations

import random

import torch
import torch.distributed as dist
from torch import nn

from training.checkpoint import Checkpointer, TrainerState
from training.dist import init_distributed


def test_a_checkpoint_restores_the_torch_and_python_rng(world_of_one, tmp_path):
    """Checked against the uninterrupted process: after a save, its next draws are recorded; a
    process that reseeds (as a restarted worker does at start-up) and loads the checkpoint
    draws the same numbers, from torch's generator and from Python's."""
    env = init_distributed(timeout_s=30)
    try:
        model = nn.Linear(4, 4)
        optimizer = torch.optim.AdamW(model.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        torch.manual_seed(3)
        random.seed(3)
        torch.rand(7), random.random()  # the streams have moved on since their seeds
        writer = Checkpointer(str(tmp_path), keep=1, env=env, async_save=False)
        writer.save(1, model, optimizer, TrainerState(scheduler), {})
        writer.close()
        uninterrupted = (torch.rand(5), [random.random() for _ in range(3)])

        torch.manual_seed(11)
        random.seed(11)
        assert Checkpointer(str(tmp_path), keep=1, env=env).resume(model, optimizer, TrainerState(scheduler))
        resumed = (torch.rand(5), [random.random() for _ in range(3)])
    finally:
        dist.destroy_process_group()
    assert torch.equal(resumed[0], uninterrupted[0]), "torch's RNG did not come back"
    assert resumed[1] == uninterrupted[1], "Python's RNG did not come back"
