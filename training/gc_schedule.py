"""Python's garbage collector on a schedule instead of by allocation count (`training.bench
--gc-every`).

CPython runs a collection whenever enough container objects have been allocated since the
last one; the oldest generation's collection walks every tracked object of the process
(transformers, torch's modules and compiled graphs: millions of objects) and holds the GIL
while it does, so the host stops queueing GPU work. If that happens while the GPU queue is
short, the step waits for it. `GcSchedule` moves everything that setup created into the
permanent generation (`gc.freeze`: never walked again), turns automatic collection off, and
collects the young generations every N optimizer steps, at a step boundary, as torchtitan's
`GarbageCollection` does. Reference cycles created during training are still freed, N steps
late at most. 0 leaves Python's automatic collection as it is.

Measured on one H200 (docs/performance.md, "Packed rows"): three bench runs each way, 20 timed
steps, no stall in any and the same speed (26,833 and 26,801 tokens/s mean), so the fine-tune
keeps Python's automatic collection; the bench keeps the switch to look again.
"""

from __future__ import annotations

import gc


class GcSchedule:
    """Collect every `every` steps (0: Python's automatic collection, unchanged)."""

    def __init__(self, every: int):
        self.every = every
        if every:
            gc.collect()
            gc.freeze()
            gc.disable()

    def step(self, step: int) -> None:
        """Call after optimizer step `step` (1-based)."""
        if self.every and step % self.every == 0:
            gc.collect(1)

    def close(self) -> None:
        """Automatic collection back on (the process goes on: tests, the export)."""
        if self.every:
            gc.unfreeze()
            gc.enable()
