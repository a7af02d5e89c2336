"""User-facing errors: one clear message that says what to change."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user fixes by changing a flag, the environment or the cluster.

    The entry point prints the message alone (no traceback) and exits with status 1.
    """


OOM_ADVICE = (
    "Out of GPU memory{where}. To fit: run on more nodes (the shards get smaller), use "
    "--sharding FULL_SHARD (SHARD_GRAD_OP and NO_SHARD keep more on each GPU), turn on "
    "--activation-checkpointing full, or lower --batch-size (raise --grad-accum to keep the "
    "global batch) or --seq-len.")
