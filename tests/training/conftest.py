"""Helpers for the training tests: real torchrun processes on CPU with gloo.

Every multi-process test fine-tunes the `tiny` preset (2 layers, hidden 64, 320-token byte
vocabulary) on the shipped dataset at --seq-len 512 (every example fits whole; 228 packed rows,
most holding two examples), with OMP_NUM_THREADS=1, so the whole
suite stays within a few minutes on 2 cores. Runs that several tests compare against are
session fixtures and run once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from training.ports import free_port  # noqa: F401  (re-exported: the tests import it from here)

REPO = Path(__file__).resolve().parents[2]

STEPS = 8
"""Optimizer steps of the reference run (2N in the resume tests, N = 4)."""

SEED = 7
TINY_FLAGS = [
    "--model", "tiny", "--seq-len", "512", "--learning-rate", "3e-3", "--warmup-steps", "2",
    "--no-mask-prompt", "--max-steps", str(STEPS), "--seed", str(SEED),
]
"""The tiny job every comparison uses; world x --batch-size x --grad-accum = 8 sequences."""

_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a training process: this one minus any rank variables."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_ENV and not k.startswith("PET_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               # torchrun restarts + the shared rendezvous store: see dist.SHARED_STORE_WARNING
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    env.pop("HF_TOKEN", None)
    env.update(extra)
    return env


def torchrun_cmd(nproc: int, launcher: list[str] | None = None,
                 module: str = "training.finetune",
                 via: str = "torch.distributed.run") -> list[str]:
    """`torchrun [launcher] --nproc-per-node=N -m module`, one node by default (--standalone);
    ``via``: the launcher's module (training.launch: what the job's pods run)."""
    launcher = ["--standalone"] if launcher is None else launcher
    return [sys.executable, "-m", via, *launcher, f"--nproc-per-node={nproc}", "-m", module]


def start(cmd: list[str], own_process_group: bool = False, **env: str) -> subprocess.Popen:
    """A training command started in the background from the repository, with the training
    environment (``child_env``); its stdout and stderr in one text pipe. ``own_process_group``:
    the command leads a process group of its own, as a terminal's foreground job does, so a
    test can signal that group (`os.killpg`) the way Ctrl-C does without signalling pytest."""
    return subprocess.Popen(cmd, cwd=REPO, env=child_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            process_group=0 if own_process_group else None)


def finetune_in_one_process(cache: Path, *flags: str, env: dict | None = None,
                            prefix: tuple[str, ...] = (),
                            timeout: float = 480) -> subprocess.CompletedProcess:
    """`python -m training.finetune` without torchrun (world size 1), run to its end."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "training.finetune", "--cache-dir", str(cache), *flags],
        cwd=REPO, env=child_env(**(env or {})), capture_output=True, text=True, timeout=timeout)


@dataclass
class Run:
    """A finished training run: its exit status, output, and where it wrote."""

    returncode: int
    output: str
    workdir: Path

    @property
    def metrics_file(self) -> Path:
        return self.workdir / "metrics.jsonl"

    def steps(self) -> dict[int, dict]:
        """Step records by step; a step redone after a restart keeps its last record."""
        return steps_of(self.metrics_file)

    def losses(self) -> list[float]:
        records = self.steps()
        return [records[s]["train/loss"] for s in sorted(records)]

    def check(self) -> Run:
        assert self.returncode == 0, f"training failed ({self.returncode}):\n{self.output[-6000:]}"
        return self


def two_agents(tmp_path: Path, name: str, launcher: list[str], *flags: str, nproc: int = 1,
               env: dict | None = None, timeout: float = 240) -> list[Run]:
    """Two torchrun agents ("nodes") of ``nproc`` processes each, started together with the
    rendezvous flags ``launcher`` (or none, with ``env`` as the operator's ``PET_*``), the tiny
    run with ``flags``, each agent's metrics in ``tmp_path/<name>-node<i>/``; run to their end."""
    procs = []
    for node in range(2):
        work = tmp_path / f"{name}-node{node}"
        work.mkdir()
        cmd = torchrun_cmd(nproc, launcher) + [*TINY_FLAGS, *flags, "--metrics-file", str(work / "metrics.jsonl")]
        procs.append((start(cmd, **(env or {})), work))
    runs = []
    for proc, work in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
        runs.append(Run(proc.returncode, out, work).check())
    return runs


def records_of(path: Path, skip: int = 0) -> list[dict]:
    """The metrics file's records after its first `skip` lines; a last line without its newline
    is one the run is still writing, not a record yet."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)[skip:]
    return [json.loads(line) for line in lines if line.endswith("\n")]


def evals_of(path: Path) -> dict[int, dict]:
    """Evaluation records by step."""
    return {r["eval/step"]: r for r in records_of(path) if "eval/step" in r}


def summary_of(path: Path) -> dict:
    """The run's last summary record."""
    return [r for r in records_of(path) if "summary/steps" in r][-1]


def held_out(records: list[dict], fraction: float) -> list[dict]:
    """The validation records by the documented rule (training/dataset.py), computed here:
    SHA-256 of the record's canonical JSON, as a fraction of 2**64 from its first 8 bytes,
    below `fraction`."""
    import hashlib

    def place(record: dict) -> float:
        canonical = json.dumps(record, sort_keys=True, ensure_ascii=False)
        return int(hashlib.sha256(canonical.encode()).hexdigest()[:16], 16) / 2**64

    return [r for r in records if place(r) < fraction]


def steps_of(path: Path) -> dict[int, dict]:
    """Training-step records by step (a step run again after a restart: its last record)."""
    records: dict[int, dict] = {}
    for r in records_of(path):
        if "train/step" in r:
            records[r["train/step"]] = r
    return records


def train(workdir: Path, *flags: str, nproc: int = 2, cache: Path, env: dict | None = None,
          launcher: list[str] | None = None, timeout: float = 240) -> Run:
    """Run `torchrun -m training.finetune` to completion; metrics go to workdir/metrics.jsonl."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_cmd(nproc, launcher) + [
        *TINY_FLAGS, "--cache-dir", str(cache), "--metrics-file", str(workdir / "metrics.jsonl"),
        *flags]
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(**(env or {})), capture_output=True,
                          text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout + proc.stderr, workdir)


def assert_losses_close(actual: list[float], expected: list[float], rtol: float,
                        what: str) -> None:
    assert len(actual) == len(expected), f"{what}: {len(actual)} steps vs {len(expected)}"
    worst = max(abs(a - e) / abs(e) for a, e in zip(actual, expected))
    assert worst <= rtol, (f"{what}: losses differ by up to {worst:.2e} (relative), more than "
                           f"{rtol:.0e}:\n  got      {actual}\n  expected {expected}")


@pytest.fixture
def world_of_one(monkeypatch):
    """init_distributed's own world of one (as `python -m training.finetune` without torchrun
    gets); its variables and the allocator default set_runtime_defaults adds are removed again
    afterwards."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    had_alloc_conf = "PYTORCH_CUDA_ALLOC_CONF" in os.environ
    yield
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT") + (() if had_alloc_conf else ("PYTORCH_CUDA_ALLOC_CONF",)):
        os.environ.pop(key, None)


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory) -> Path:
    """One download cache for the session (the tiny preset is materialised once)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def reference(tmp_path_factory, tiny_cache) -> Run:
    """The uninterrupted reference: FULL_SHARD, 2 ranks x --batch-size 4, 8 steps, checkpoints
    every 4 steps, fp32 export. Resume, fault and strategy tests compare against it."""
    work = tmp_path_factory.mktemp("reference")
    return train(work, "--batch-size", "4", "--checkpoint-dir", str(work / "ckpt"),
                 "--checkpoint-every", "4", "--output-dir", str(work / "export"),
                 "--export-dtype", "fp32", cache=tiny_cache).check()
