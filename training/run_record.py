"""What a run was started with, recorded in each checkpoint (RUN.json beside its manifest), and
what a resume may change.

A checkpoint holds a position in the data (epoch, packed rows consumed of that epoch's seeded
order) and the optimizer's and schedule's state. A resume whose packed training rows or seed
differ would continue at a position that means nothing in the new order: refused, naming the
settings that differ (or the data itself when no setting does). Anything else can continue: a
changed global batch (world size x --batch-size x --grad-accum) takes the next rows of the same
order, so each row is still seen once per epoch; the step then averages another number of
sequences (a warning). Learning rate, warm-up, the cosine's floor and weight decay live in the
optimizer's and schedule's saved state, so the checkpoint's values continue and a new value is
not used (a warning that says so); --max-grad-norm, --precision and --float8-recipe apply from
the next step (a warning). Length settings (--epochs, --max-steps) and cadences change silently: they are meant
to. A different model shape does not load (checkpoint.py's error).
"""

from __future__ import annotations

import zlib

from training.config import JobConfig, flag, flat

DATA_SETTINGS = ("dataset", "dataset_split", "data_format", "prompt_field", "response_field",
                 "prompt_template", "val_fraction", "seq_len", "mask_prompt")
"""The settings that decide the packed training rows."""
BATCH_SETTINGS = ("world_size", "batch_size", "grad_accum")
RESTORED_SETTINGS = ("learning_rate", "warmup_steps", "min_lr_ratio", "weight_decay")
"""Saved in the optimizer's and schedule's state: the checkpoint's value continues."""
APPLIED_SETTINGS = ("max_grad_norm", "precision", "float8_recipe", "model")


def data_fingerprint(inputs, targets) -> dict:
    """The packed training rows: their count and a CRC32 of their tokens and targets."""
    crc = zlib.crc32(targets.numpy(), zlib.crc32(inputs.numpy()))
    return {"rows": int(inputs.shape[0]), "crc32": crc}


def run_record(cfg: JobConfig, world_size: int, data: dict) -> dict:
    """This run's record: its settings, world size and training rows' fingerprint."""
    return {"settings": flat(cfg), "world_size": world_size, "data": data}


def record_problem(record) -> str | None:
    """What keeps a RUN.json's content from being a record of `run_record`'s shape (settings,
    world size, the rows' fingerprint; the batch sizes, where present, whole numbers: `compare`
    multiplies them), or None."""
    data = record.get("data") if isinstance(record, dict) else None
    settings = record.get("settings") if isinstance(record, dict) else None
    if (isinstance(settings, dict) and isinstance(record.get("world_size"), int)
            and all(isinstance(settings.get(k, 1), int) for k in ("batch_size", "grad_accum"))
            and isinstance(data, dict) and all(isinstance(data.get(k), int) for k in ("rows", "crc32"))):
        return None
    return ("is not a run record (an object with settings, world_size and data's rows and crc32, "
            "whole numbers)")


def _named(name: str) -> str:
    return "world size" if name == "world_size" else flag(name)


def compare(old: dict, new: dict, step: int) -> tuple[list[str], list[str]]:
    """(why the run cannot continue from the checkpoint, warnings) for resuming at ``step`` a
    checkpoint written with ``old`` in a run started with ``new``."""
    now = {**new["settings"], "world_size": new["world_size"]}
    # a setting the old record lacks was added to the package after it was written: the
    # checkpoint's run could not have set it, so it is not reported as changed
    before = {**now, **old["settings"], "world_size": old["world_size"]}

    def changes(names) -> list[str]:
        return [f"{_named(n)} {before[n]!r} -> {now[n]!r}" for n in names if before[n] != now[n]]

    refused, warnings = [], []
    if old["data"] != new["data"] or before["seed"] != now["seed"]:
        what = changes((*DATA_SETTINGS, "seed")) or [
            f"the dataset's content or the tokenizer ({old['data']['rows']} -> "
            f"{new['data']['rows']} packed rows, another CRC32)"]
        refused.append(
            f"the training data or its order differs from the checkpoint's ({'; '.join(what)}), "
            f"so its data position (step {step}) means nothing here. Resume with the "
            "checkpoint's settings and data, or start afresh from its weights: a new "
            "--checkpoint-dir with --model set to this run's export")
    batch = changes(BATCH_SETTINGS)
    global_before = before["world_size"] * before["batch_size"] * before["grad_accum"]
    global_now = now["world_size"] * now["batch_size"] * now["grad_accum"]
    if global_before != global_now:
        warnings.append(f"the global batch changes from {global_before} to {global_now} "
                        f"sequences ({'; '.join(batch)}): the data order continues where the "
                        "checkpoint stopped, each step now averages another number of "
                        "sequences")
    restored = changes(RESTORED_SETTINGS)
    if restored:
        warnings.append(f"{'; '.join(restored)}: the checkpoint's value continues (it is part "
                        "of the saved optimizer and schedule state) and the new one is not "
                        "used; a new --checkpoint-dir starts afresh with it")
    applied = changes(APPLIED_SETTINGS)
    if applied:
        warnings.append(f"{'; '.join(applied)}: the new value applies from step {step + 1} "
                        "(the weights are the checkpoint's)")
    return refused, warnings
