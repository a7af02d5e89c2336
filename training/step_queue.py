"""The fine-tune's step results read without stalling the GPU.

Reading a step's loss on the host (`float()`) waits for the GPU to finish that step, and the
GPU then idles until the host has queued the next step's first kernels. The loop instead queues
step N+1 before it reads step N: each step's numbers (loss, gradient norm, and the signal, if
any, that asked a rank to stop: training/termination.py) are copied into page-locked host
memory right behind the step, with an event after the copy, and the host waits on that event
alone, while the GPU runs the next step.

A step's time is measured on the GPU's own timeline, between events recorded before and after
the step is queued (on the CPU, where every operation runs as it is called, between the host's
clock readings). That is the step's wall time whenever the GPU does not wait for the host,
which is what queuing ahead is for.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist


class StepClock:
    """Marks around a step: CUDA events on the current stream, or the host's clock on the
    CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        """The time between two marks; on CUDA only once ``end`` has completed."""
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


@dataclass
class StepResult:
    """One queued step's numbers, read on the host (`StepQueue.pop`)."""

    step: int
    loss: float
    grad_norm: float
    step_time_s: float
    stop_signal: int
    """The signal some rank had been sent when this step was queued, 0 for none (the same
    answer on every rank: the largest over the ranks, taken on the device)."""


@dataclass
class _Queued:
    step: int
    host: torch.Tensor
    copied: torch.cuda.Event | None
    start: object
    end: object


class StepQueue:
    """Steps queued on the device, oldest first, whose numbers the host has not read yet."""

    def __init__(self, device: torch.device):
        self.device = device
        self.clock = StepClock(device)
        self._queued: deque[_Queued] = deque()

    def __len__(self) -> int:
        return len(self._queued)

    def start(self):
        """A mark before a step is queued (pass it to `push`)."""
        return self.clock.mark()

    def push(self, step: int, start, loss: torch.Tensor, grad_norm: torch.Tensor,
             stop_signal: int) -> None:
        """Queue the copy of step ``step``'s results (0-d device tensors; ``stop_signal``: the
        signal this rank has been sent to stop, 0 for none) behind the step; nothing here waits
        for the GPU."""
        end = self.clock.mark()
        # torch.full launches a fill kernel with the flag as its argument: unlike
        # torch.tensor(flag, device=...) there is no host-to-device copy for the host to wait on.
        flag = torch.full((), float(stop_signal), dtype=torch.float64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        values = torch.stack([loss.detach().double(), grad_norm.detach().double(), flag])
        cuda = self.device.type == "cuda"
        host = torch.empty(3, dtype=torch.float64, pin_memory=cuda)
        host.copy_(values, non_blocking=cuda)
        copied = None
        if cuda:
            copied = torch.cuda.Event()
            copied.record()
        self._queued.append(_Queued(step, host, copied, start, end))

    def pop(self) -> StepResult:
        """The oldest queued step's numbers; waits for that step only, not for later ones."""
        q = self._queued.popleft()
        if q.copied is not None:
            q.copied.synchronize()
        loss, grad_norm, stop_signal = q.host.tolist()
        return StepResult(q.step, loss, grad_norm, self.clock.seconds(q.start, q.end),
                          int(stop_signal))
