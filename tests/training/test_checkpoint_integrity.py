"""Damaged checkpoints: every kind of damage ends in a resume from the last sound checkpoint.

In-process (a world of one, gloo) for the kinds of damage, and one 2-rank torchrun run that
resumes past a damaged newest checkpoint with the uninterrupted run's losses.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.training.conftest import STEPS, assert_losses_close, train
from training import config as C
from training.checkpoint import (
    COMPLETE_MARKER,
    DAMAGED_PREFIX,
    DCP_METADATA,
    MANIFEST,
    RUN_RECORD,
    Checkpointer,
    TrainerState,
    best_checkpoint,
    complete_checkpoints,
)
from training.dist import init_distributed
from training.errors import UserError
from training.run_record import run_record

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def env(world_of_one):
    env = init_distributed(timeout_s=30)
    yield env
    dist.destroy_process_group()


def _job(width: int = 8):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.Linear(width, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = TrainerState(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))
    return model, optimizer, trainer


def _train_to(step: int, model, optimizer, trainer) -> None:
    while trainer.step < step:
        model(torch.randn(4, model[0].in_features)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        trainer.step += 1


def _weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _saved(root: Path, env, steps=(2, 4), async_save=False,
           run_record: dict | None = None) -> dict[int, list[torch.Tensor]]:
    """Checkpoints at `steps` of one job; returns the weights each holds."""
    ckpt = Checkpointer(str(root), keep=len(steps), env=env, async_save=async_save,
                        run_record=run_record)
    model, optimizer, trainer = _job()
    weights = {}
    for step in steps:
        _train_to(step, model, optimizer, trainer)
        ckpt.save(step, model, optimizer, trainer, {})
        weights[step] = _weights(model)
    ckpt.close()
    return weights


def _shard(path: Path) -> Path:
    return min(path.glob("__0_*.distcp"))


def _flip_a_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


DAMAGE = {
    "missing shard": (lambda p: _shard(p).unlink(), "__0_0.distcp is missing"),
    "truncated shard": (lambda p: _shard(p).write_bytes(_shard(p).read_bytes()[:100]),
                        "has 100 bytes"),
    "corrupted shard (same size)": (lambda p: _flip_a_byte(_shard(p)), "does not match its CRC32"),
    "corrupted DCP metadata": (lambda p: _flip_a_byte(p / DCP_METADATA),
                               ".metadata does not match its CRC32"),
    "corrupted manifest": (lambda p: (p / MANIFEST).write_text('{"files": {}}'),
                           f"{MANIFEST} does not match the CRC32"),
    "missing manifest": (lambda p: (p / MANIFEST).unlink(), f"{MANIFEST} is missing"),
    "unreadable COMPLETE marker": (lambda p: (p / COMPLETE_MARKER).write_text('{"step": 4'),
                                   f"{COMPLETE_MARKER} is unreadable"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(kind, env, tmp_path, caplog):
    """Checked against the weights each checkpoint was saved with: after damaging the newest
    checkpoint (step 4) in one way, resume loads step 2's exact weights, warns naming the
    damage and the step used instead, and keeps the damaged directory aside."""
    saved = _saved(tmp_path, env)
    damage, says = DAMAGE[kind]
    damage(tmp_path / "step_00000004")
    model, optimizer, trainer = _job()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        used = Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer)
    assert used == tmp_path / "step_00000002" and trainer.step == 2
    assert all(torch.equal(a, b) for a, b in zip(_weights(model), saved[2]))
    assert says in caplog.text and "falling back to step 2" in caplog.text, caplog.text
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith(DAMAGED_PREFIX)]
    assert len(aside) == 1 and aside[0].startswith(f"{DAMAGED_PREFIX}step_00000004."), aside
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2]


RECORD = run_record(C.JobConfig(), 1, {"rows": 10, "crc32": 1})
"""What the job of these tests records in RUN.json (any run record: the same on both sides)."""

RUN_RECORD_DAMAGE = {
    "not JSON": ('{"settings": {"model": "ti', f"{RUN_RECORD} is unreadable (Unterminated"),
    "empty": ("", f"{RUN_RECORD} is unreadable (Expecting value"),
    "a JSON list": ("[]", f"{RUN_RECORD} is not a run record"),
    "without world size": (json.dumps({"settings": RECORD["settings"], "data": RECORD["data"]}),
                           f"{RUN_RECORD} is not a run record"),
    "a batch size that is not a number": (
        json.dumps({**RECORD, "settings": {**RECORD["settings"], "batch_size": None}}),
        f"{RUN_RECORD} is not a run record"),
}
"""RUN.json contents that are not a run record, and what resume says of each when nothing
else vouches for the file (a manifest of an older version that does not list it)."""

ANOTHER_RECORD = json.dumps({**RECORD, "settings": {**RECORD["settings"], "seed": 43}}, indent=1)
"""A sound run record of another run, as long as RECORD's (a changed seed: resuming under it
is refused)."""


def _as_an_older_version_wrote_it(path: Path) -> None:
    """Rewrite a checkpoint's manifest as the version before RUN.json was listed wrote it: no
    RUN.json entry, no ``unlisted``, the COMPLETE marker holding the new manifest's CRC32."""
    manifest = json.loads((path / MANIFEST).read_text())
    files = {k: v for k, v in manifest["files"].items() if k != RUN_RECORD}
    raw = json.dumps({"step": manifest["step"], "files": files}, indent=1, sort_keys=True)
    (path / MANIFEST).write_text(raw)
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    (path / COMPLETE_MARKER).write_text(json.dumps({**marker,
                                                    "manifest_crc32": zlib.crc32(raw.encode())}))


def _resume_with_record(root: Path, env, caplog) -> tuple[TrainerState, list[str]]:
    """Resume ``root`` in a job whose run record is RECORD; (its trainer state, the warnings)."""
    model, optimizer, trainer = _job()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        Checkpointer(str(root), 2, env, run_record=RECORD).resume(model, optimizer, trainer)
    trainer.weights = _weights(model)
    return trainer, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("kind", [*RUN_RECORD_DAMAGE, "another run's record", "missing"])
def test_a_run_record_that_does_not_match_the_manifest_is_damage(kind, env, tmp_path, caplog):
    """Checked against the weights each checkpoint was saved with: the newest checkpoint's
    RUN.json damaged (truncated, replaced, a sound record of another run of the same size,
    deleted); its manifest lists RUN.json, so resume sets step 4 aside naming RUN.json and
    loads step 2's weights, whose record is compared (before: RUN.json was outside the
    manifest, so another run's record refused the resume with a changed --seed, and a deleted
    one resumed saying an older version wrote the checkpoint)."""
    saved = _saved(tmp_path, env, run_record=RECORD)
    path = tmp_path / "step_00000004" / RUN_RECORD
    if kind == "missing":
        path.unlink()
    else:
        path.write_text(ANOTHER_RECORD if kind == "another run's record"
                        else RUN_RECORD_DAMAGE[kind][0])
    trainer, warnings = _resume_with_record(tmp_path, env, caplog)
    assert trainer.step == 2 and all(torch.equal(a, b) for a, b in zip(trainer.weights, saved[2]))
    says = {"missing": f"{RUN_RECORD} is missing",
            "another run's record": f"{RUN_RECORD} does not match its CRC32"}.get(
                kind, f"{RUN_RECORD} has ")
    assert any(says in w and "falling back to step 2" in w for w in warnings), warnings
    assert not any("an older version wrote it" in w for w in warnings), warnings
    assert [p.name.split(".")[:2] for p in tmp_path.glob(f"{DAMAGED_PREFIX}*")] == [
        ["damaged", "step_00000004"]]


@pytest.mark.parametrize("kind", RUN_RECORD_DAMAGE)
def test_an_unlisted_run_record_that_does_not_read_is_damage(kind, env, tmp_path, caplog):
    """Checked against the weights each checkpoint was saved with: in checkpoints of the
    version before RUN.json was listed in the manifest, the newest one's RUN.json replaced by
    something that is not a run record; resume sets it aside naming RUN.json and what is wrong
    with it, and loads step 2's weights (before: a TypeError or KeyError traceback from the
    comparison, or, for text that is not JSON, a warning that an older version wrote the
    checkpoint and nothing compared)."""
    saved = _saved(tmp_path, env, run_record=RECORD)
    for step in (2, 4):
        _as_an_older_version_wrote_it(tmp_path / f"step_{step:08d}")
    text, says = RUN_RECORD_DAMAGE[kind]
    (tmp_path / "step_00000004" / RUN_RECORD).write_text(text)
    trainer, warnings = _resume_with_record(tmp_path, env, caplog)
    assert trainer.step == 2 and all(torch.equal(a, b) for a, b in zip(trainer.weights, saved[2]))
    assert any(says in w and "falling back to step 2" in w for w in warnings), warnings
    assert [p.name.split(".")[:2] for p in tmp_path.glob(f"{DAMAGED_PREFIX}*")] == [
        ["damaged", "step_00000004"]]


UNVERIFIED = f"its {MANIFEST} does not list {RUN_RECORD} (an older version wrote it)"


@pytest.mark.parametrize("settings, warned", [
    (RECORD["settings"], [UNVERIFIED]), ({}, [UNVERIFIED]),
    (None, [f"has no {RUN_RECORD} (an older version wrote it)"])],
    ids=["sound", "settings-of-an-older-version", "no-run-record"])
def test_a_run_record_of_an_older_version_resumes(settings, warned, env, tmp_path, caplog):
    """Checked against the decision in training/checkpoint.py's docstring for checkpoints of
    the version before RUN.json was listed in the manifest: step 4 resumes with its weights,
    its RUN.json compared with one warning that nothing vouches for it; a RUN.json whose
    settings predate every setting of today is no change (run_record.compare's rule; before: a
    KeyError on the global batch's sizes); without RUN.json, one warning that nothing was
    compared."""
    saved = _saved(tmp_path, env, run_record=RECORD)
    _as_an_older_version_wrote_it(tmp_path / "step_00000004")
    path = tmp_path / "step_00000004" / RUN_RECORD
    if settings is None:
        path.unlink()
    else:
        path.write_text(json.dumps({**RECORD, "settings": settings}))
    trainer, warnings = _resume_with_record(tmp_path, env, caplog)
    assert trainer.step == 4 and all(torch.equal(a, b) for a, b in zip(trainer.weights, saved[4]))
    assert len(warnings) == len(warned) and all(w in m for w, m in zip(warned, warnings)), warnings


def test_an_older_run_record_of_another_run_is_still_refused(env, tmp_path):
    """Checked against run_record.compare: an unlisted RUN.json (older version) of a run with
    another --seed refuses the resume naming the seed, as before RUN.json was listed."""
    _saved(tmp_path, env, run_record=RECORD)
    _as_an_older_version_wrote_it(tmp_path / "step_00000004")
    (tmp_path / "step_00000004" / RUN_RECORD).write_text(ANOTHER_RECORD)
    model, optimizer, trainer = _job()
    with pytest.raises(UserError, match="--seed 43 -> 42"):
        Checkpointer(str(tmp_path), 2, env, run_record=RECORD).resume(model, optimizer, trainer)


def test_the_best_checkpoint_has_the_lowest_finite_loss(tmp_path):
    """Checked against markers written here: validation losses NaN (a diverged evaluation,
    which json writes as NaN), 2.0, 1.5, a string and null by step; the best is step 3
    (before: a NaN first in step order was kept as the minimum, since NaN compares false with
    every loss, and a string was a TypeError)."""
    for step, loss in enumerate([float("nan"), 2.0, 1.5, "1.0", None], start=1):
        path = tmp_path / f"step_{step:08d}"
        path.mkdir()
        (path / COMPLETE_MARKER).write_text(json.dumps({"step": step, "eval_loss": loss}))
    assert best_checkpoint(tmp_path) == (3, tmp_path / "step_00000003", 1.5)


@pytest.mark.parametrize("marker", ["missing", "a directory"])
def test_a_newer_step_directory_without_marker_is_named(marker, env, tmp_path, caplog):
    """Checked against the weights saved at step 4: a copy of step 4 as step_00000006 without
    its COMPLETE marker (an incomplete copy; a marker that is a directory), resume loads step
    4 and warns naming step_00000006, which stays (before: it was passed over without a word,
    and a directory of only such copies started from step 0 silently)."""
    saved = _saved(tmp_path, env)
    shutil.copytree(tmp_path / "step_00000004", tmp_path / "step_00000006")
    (tmp_path / "step_00000006" / COMPLETE_MARKER).unlink()
    if marker == "a directory":
        (tmp_path / "step_00000006" / COMPLETE_MARKER).mkdir()
    model, optimizer, trainer = _job()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer)
    assert trainer.step == 4 and all(torch.equal(a, b) for a, b in zip(_weights(model), saved[4]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"{tmp_path / 'step_00000006'} has no COMPLETE marker (a copy or a "
                        "deletion that did not finish): not a checkpoint, not resumed"]
    assert (tmp_path / "step_00000006").is_dir()


def test_a_directory_without_checkpoints_says_it_starts_from_step_0(env, tmp_path, caplog):
    """Checked against an empty --checkpoint-dir (a new run, or a mistyped path): resume says
    that it starts from step 0 and where it looked."""
    model, optimizer, trainer = _job()
    with caplog.at_level(logging.INFO, logger="training.checkpoint"):
        assert Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer) is None
    assert f"no complete checkpoint in {tmp_path}: starting from step 0" in caplog.text


def test_a_file_system_error_is_one_error_and_sets_nothing_aside(env, tmp_path, monkeypatch):
    """Checked against errno's EIO (a failing disk or a lost mount) raised while rank 0 lists
    the checkpoint directory: the resume ends with one UserError naming the path and the
    error, shared with every rank (before: the OSError left the other ranks waiting for rank
    0's broadcast until the collective timeout), and both checkpoints stay in place."""
    import errno

    _saved(tmp_path, env)

    def failing(root: Path):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(root))

    monkeypatch.setattr("training.checkpoint._step_dirs", failing)
    model, optimizer, trainer = _job()
    with pytest.raises(UserError, match=f"reading {tmp_path} failed \\(Input/output error\\)"):
        Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000004"]


def test_a_file_system_error_while_verifying_is_one_error(env, tmp_path, monkeypatch):
    """Checked against errno's EIO raised while a rank reads a shard to verify it: the same
    single UserError on every rank (gathered with the verification, so no rank waits for the
    others until the collective timeout), naming the shard; nothing is set aside as damaged."""
    import errno

    _saved(tmp_path, env)

    def failing(path: Path) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))

    monkeypatch.setattr("training.checkpoint.file_crc32", failing)
    model, optimizer, trainer = _job()
    with pytest.raises(UserError, match=r"reading \S+step_00000004\S* failed \(Input/output error\)"):
        Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000004"]


def test_sound_checkpoints_load_the_newest_without_warnings(env, tmp_path, caplog):
    """Checked against the saved weights (the case where nothing should change): no damage,
    resume takes step 4, sets nothing aside and warns about nothing."""
    saved = _saved(tmp_path, env)
    model, optimizer, trainer = _job()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer)
    assert trainer.step == 4 and all(torch.equal(a, b) for a, b in zip(_weights(model), saved[4]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [] and not list(tmp_path.glob(f"{DAMAGED_PREFIX}*"))


def test_every_checkpoint_damaged_starts_from_step_0_and_says_so(env, tmp_path, caplog):
    """Checked against the fallback rule: with no sound checkpoint left, both are set aside
    and the run starts from step 0 (with a warning), instead of failing every restart."""
    _saved(tmp_path, env)
    for step in (2, 4):
        _shard(tmp_path / f"step_{step:08d}").unlink()
    model, optimizer, trainer = _job()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        assert Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer) is None
    assert trainer.step == 0 and "starting from step 0" in caplog.text
    assert len(list(tmp_path.glob(f"{DAMAGED_PREFIX}*"))) == 2


def test_a_checkpoint_without_manifest_is_checked_by_loading_it(env, tmp_path, caplog):
    """Checked against DCP's own failure (a CheckpointException, a BaseException): a checkpoint
    written before manifests existed, with a shard missing, is set aside and the previous one
    loads; an intact one without manifest still loads (with a warning)."""
    saved = _saved(tmp_path, env)
    for step in (2, 4):
        (tmp_path / f"step_{step:08d}" / MANIFEST).unlink()
        (tmp_path / f"step_{step:08d}" / COMPLETE_MARKER).write_text(json.dumps({"step": step}))
    _shard(tmp_path / "step_00000004").unlink()
    model, optimizer, trainer = _job()
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer)
    assert trainer.step == 2 and all(torch.equal(a, b) for a, b in zip(_weights(model), saved[2]))
    assert "DCP cannot load it: CheckpointException" in caplog.text, caplog.text


def test_an_intact_checkpoint_of_another_model_is_an_error_not_damage(env, tmp_path):
    """Checked against the rule that only damage is set aside: a verified checkpoint that does
    not fit the model (another width) raises a UserError naming the cause and moves nothing."""
    _saved(tmp_path, env)
    model, optimizer, trainer = _job(width=16)
    with pytest.raises(UserError, match="intact .* does not load into this job"):
        Checkpointer(str(tmp_path), 2, env).resume(model, optimizer, trainer)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 4]


def test_async_checkpoint_is_complete_and_loadable(env, tmp_path):
    """Checked against the weights at the save: an async save (dcp.async_save) that training
    keeps running past is complete once closed, its manifest lists every file it holds (RUN.json
    too) but itself and the COMPLETE marker, which it names as unlisted, and it loads the weights of the step it was taken at, not later ones."""
    saved = _saved(tmp_path, env, steps=(3,), async_save=True, run_record=RECORD)
    path = tmp_path / "step_00000003"
    manifest = json.loads((path / MANIFEST).read_text())
    assert RUN_RECORD in manifest["files"]
    assert set(manifest["files"]) == {p.name for p in path.iterdir()} - set(manifest["unlisted"])
    assert set(manifest["unlisted"]) == {MANIFEST, COMPLETE_MARKER}
    model, optimizer, trainer = _job()
    Checkpointer(str(tmp_path), 1, env).resume(model, optimizer, trainer)
    assert trainer.step == 3 and all(torch.equal(a, b) for a, b in zip(_weights(model), saved[3]))


def test_async_save_pending_while_training_holds_the_staged_weights(env, tmp_path):
    """Checked against the weights at the save: training steps run while an async save is
    pending (poll() completes it), and the checkpoint holds the weights of its own step."""
    ckpt = Checkpointer(str(tmp_path), 2, env, async_save=True)
    model, optimizer, trainer = _job()
    _train_to(2, model, optimizer, trainer)
    ckpt.save(2, model, optimizer, trainer, {})
    at_save = _weights(model)
    _train_to(5, model, optimizer, trainer)  # the optimizer changes the weights meanwhile
    for _ in range(200):  # poll() completes it once the background write is done
        if ckpt.pending is None:
            break
        ckpt.poll()
        time.sleep(0.05)
    assert ckpt.pending is None, "the async save never completed"
    ckpt.close()
    fresh, optimizer, trainer = _job()
    Checkpointer(str(tmp_path), 2, env).resume(fresh, optimizer, trainer)
    assert trainer.step == 2 and all(torch.equal(a, b) for a, b in zip(_weights(fresh), at_save))


def test_torchrun_resumes_past_a_damaged_newest_checkpoint(reference, tmp_path, tiny_cache):
    """Checked against the uninterrupted reference run: a copy of its checkpoints with one
    shard of the newest (step STEPS) deleted; a 2-rank torchrun run on that copy resumes from
    step STEPS/2 with a warning naming the missing file, and steps STEPS/2+1..STEPS give the
    reference's losses."""
    n = STEPS // 2
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference.workdir / "ckpt", ckpt)
    (ckpt / f"step_{STEPS:08d}" / "__1_0.distcp").unlink()
    run = train(tmp_path, "--batch-size", "4", "--checkpoint-dir", str(ckpt),
                "--checkpoint-every", str(n), cache=tiny_cache).check()
    assert "__1_0.distcp is missing" in run.output and f"falling back to step {n}" in run.output
    assert f"resumed from {ckpt}/step_{n:08d}" in run.output
    assert sorted(run.steps()) == list(range(n + 1, STEPS + 1))
    assert_losses_close(run.losses(), reference.losses()[n:], 1e-6, "resumed past damage")
