"""The checks that need no GPU, run before the node check: `check_inputs`, cheapest first.

A typo in a flag, a path the job cannot write, or a data file that does not read ends the run
in seconds, with one message on every rank, before the node check spends minutes on the
collectives of every node (and appends its record to --metrics-file), and before the model is
downloaded. What each check covers is said where it is made: the output paths here
(`check_paths`), the checkpoint directory's owner in training/owner.py, --precision in
training/parallel.py, --model's local directory in training/hub.py, every record of the data in
training/dataset.py.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from training import hub
from training.config import JobConfig, flag
from training.dataset import Records, load_records
from training.dist import DistEnv
from training.errors import UserError
from training.export import replace_problem
from training.owner import own_checkpoint_dir
from training.parallel import check_precision
from training.prometheus import check_port


def check_inputs(cfg: JobConfig, env: DistEnv) -> Records:
    """Every check that needs neither the GPUs' collectives nor the model, in this order: the
    output paths, the --metrics-port (each node's first process), the checkpoint directory
    taken for this run (before the node check writes its probe into it), --precision against
    this GPU, a local --model directory, and every record of the data (read once, returned)."""
    check_paths(cfg)
    if cfg.metrics.metrics_port:  # served by each node's local rank 0 from the first step on
        hub.on_node_leader_first(env, lambda: check_port(cfg.metrics.metrics_port))
    own_checkpoint_dir(cfg.checkpoint.checkpoint_dir, env)
    check_precision(cfg.model.precision, env.device)
    hub.check_model_name(cfg.model.model)
    return load_records(cfg, env)


def _file_in_the_way(paths: Sequence[Path]) -> Path | None:
    """The first of ``paths`` that exists and is not a directory (so nothing can be created
    inside it), or None."""
    return next((p for p in paths if p.exists() and not p.is_dir()), None)


def _unwritable(directory: Path) -> str | None:
    """Why this process cannot create a file in ``directory`` (or, where it does not exist
    yet, in its nearest existing parent, where it will be created), or None: a real probe file
    created and removed, since permission bits, read-only mounts and quotas all show only then."""
    base = next(p for p in (directory, *directory.parents) if p.exists())
    try:
        with tempfile.NamedTemporaryFile(dir=base, prefix=".write-probe-"):
            pass
    except OSError as e:
        return f"this process (uid {os.geteuid()}) cannot create files in {base} ({e.strerror})"
    return None


def _unappendable(path: Path) -> str | None:
    """Why this process cannot append to the existing file ``path`` (a metrics file a
    previous run of another user wrote, or made read-only), or None; opened for appending and
    closed, which changes nothing."""
    if not path.is_file():
        return None
    try:
        with path.open("a"):
            pass
    except OSError as e:
        return f"this process (uid {os.geteuid()}) cannot append to it ({e.strerror})"
    return None


def check_paths(cfg: JobConfig) -> None:
    """Refuse output paths that cannot be used, before any data is read or model built: an
    existing file (or a file among the parents) where a directory must go (also --cache-dir),
    a directory where the metrics file must go, a directory this process cannot write in, a
    metrics file it cannot append to, what the export would delete (`_check_export_target`),
    and --keep-best without checkpoints to choose from."""
    c = cfg.checkpoint
    for name, value in (("checkpoint_dir", c.checkpoint_dir), ("output_dir", c.output_dir),
                        ("cache_dir", cfg.model.cache_dir)):
        if value is None:
            continue
        path = Path(value).expanduser()
        blocking = _file_in_the_way([path, *path.parents])
        if blocking is not None:
            what = "" if blocking == path else f": {blocking} is a file"
            raise UserError(f"{flag(name)} {value}: exists and is not a directory{what}; give "
                            "a directory path (it is created if missing)")
        if name == "cache_dir":  # a read-only cache filled beforehand serves an offline run;
            continue  # what cannot be written into it is named where it is written (hub)
        # Every rank writes its checkpoint shards into the directory; the export is written
        # beside --output-dir and renamed into place.
        why = _unwritable(path if name == "checkpoint_dir" else path.parent)
        if why is not None:
            raise UserError(f"{flag(name)} {value}: {why}; give a directory the job's user can "
                            "write (e.g. on the shared /fsx volume) or make this one writable")
    metrics = cfg.metrics.metrics_file
    _check_export_target(c.output_dir, {"--checkpoint-dir": c.checkpoint_dir,
                                        "--metrics-file": metrics})
    if metrics is not None:
        _check_metrics_file(metrics)
    if c.keep_best and c.checkpoint_dir is None:
        raise UserError("--keep-best: needs --checkpoint-dir (the best checkpoint is kept there "
                        "and exported at the end)")


def _check_metrics_file(metrics: str) -> None:
    """Refuse a --metrics-file that is a directory, lies below a file, or cannot be appended
    to (or created) by this process."""
    path = Path(metrics).expanduser()
    if path.is_dir():
        raise UserError(f"--metrics-file {metrics}: is a directory; give a file path")
    blocking = _file_in_the_way(path.parents)
    if blocking is not None:
        raise UserError(f"--metrics-file {metrics}: {blocking} is a file, not a directory; give "
                        "a file path whose directories can be created")
    why = _unwritable(path.parent) or _unappendable(path)
    if why is not None:
        raise UserError(f"--metrics-file {metrics}: {why}; give a file path the job's user can "
                        "write")


def _check_export_target(output_dir: str | None, others: dict[str, str | None]) -> None:
    """The export replaces --output-dir as a whole (renamed aside, then deleted): refuse one
    that holds the checkpoints or the metrics file, or anything but a previous export."""
    if output_dir is None:
        return
    out = Path(output_dir).expanduser().resolve()
    for name, value in others.items():
        inner = None if value is None else Path(value).expanduser().resolve()
        if inner is not None and (inner == out or out in inner.parents):
            raise UserError(f"{name} {value}: is inside --output-dir {output_dir}, which the "
                            "export replaces as a whole, deleting it; put it beside the output "
                            f"directory (e.g. {out.parent / inner.name})")
    problem = replace_problem(out)
    if problem is not None:
        raise UserError(f"--output-dir {output_dir}: {problem}; the export replaces the "
                        "directory as a whole, deleting what it holds: give a new or empty "
                        "directory, or a previous export")
