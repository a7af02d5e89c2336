"""Getting model files onto every node: one downloader per node, the others wait.

Local rank 0 of each node downloads into the (node-local) cache while the node's other ranks
wait on a long-timeout gloo group; a failure on any node becomes the same clear error on every
rank, instead of a hang. The Hugging Face token is read from HF_TOKEN only and never logged.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable

import torch.distributed as dist

from training import tiny
from training.config import TINY_MODEL
from training.dist import DistEnv
from training.errors import UserError
from training.model import model_dir_problem

log = logging.getLogger(__name__)

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
"""Files fetched from a model repo: config, safetensors weights and tokenizer; never *.bin."""


def hf_token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def looks_local(name: str) -> bool:
    """A --model or --dataset value written as a path (/..., ./..., ../..., ~/...), not a Hub
    id."""
    return name.startswith(("/", ".", "~"))


def on_node_leader_first(env: DistEnv, produce: Callable[[], str]) -> str:
    """Run `produce` on local rank 0 of every node, then hand its result to the whole node.

    Returns the node leader's result on every rank; raises the same UserError on every rank if
    any node's leader failed.
    """
    result, error = "", ""
    if env.is_local_main:
        try:
            result = produce()
        except UserError as e:
            error = str(e)
    gathered: list = [None] * env.world_size
    dist.all_gather_object(gathered, (result, error), group=env.slow_group)
    errors = sorted({e for _, e in gathered if e})
    if errors:
        raise UserError(errors[0])
    return gathered[env.node_leader][0]


def _download(repo_id: str, cache_dir: str | None) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError)

    token = hf_token()
    log.info("downloading %s into %s", repo_id, cache_dir or "the default Hugging Face cache")
    try:
        return snapshot_download(repo_id, cache_dir=cache_dir, token=token,
                                 allow_patterns=WEIGHT_PATTERNS)
    except GatedRepoError:
        if token is None:
            raise UserError(
                f"--model {repo_id} is a gated model and HF_TOKEN is not set: accept its licence "
                "on huggingface.co and pass a token with read access in the HF_TOKEN environment "
                "variable (the job takes it from its Kubernetes Secret).") from None
        raise UserError(
            f"--model {repo_id} is gated and the token in HF_TOKEN has no access to it: accept "
            "the model's licence with that account, or use a token that has.") from None
    except RepositoryNotFoundError:
        hint = "" if token else " (a private or gated repo also needs HF_TOKEN)"
        raise UserError(f"--model {repo_id}: no such model on the Hugging Face Hub{hint}; "
                        "pass a model id, a local directory or 'tiny'.") from None
    except LocalEntryNotFoundError as e:
        raise UserError(f"--model {repo_id}: cannot download it and it is not in the cache "
                        f"(--cache-dir {cache_dir}): {e}. Check the node's network, or "
                        "pre-fetch it and pass a local directory.") from None
    except HfHubHTTPError as e:
        raise UserError(f"--model {repo_id}: download failed: {e}") from None
    except OSError as e:  # after the hub's errors, some of which are OSErrors
        raise _cache_error(cache_dir, e) from None


def _cache_error(cache_dir: str | None, e: OSError) -> UserError:
    """A model that cannot be written into the cache (permissions, a full or read-only disk)."""
    return UserError(f"--cache-dir {cache_dir}: cannot write the model there ({e}); give a "
                     "directory the job's user can write, with room for the model")


def _local_model_dir(name: str) -> Path | None:
    """`name` as a local model directory, None if it is a Hub id; UserError if broken."""
    path = Path(name).expanduser()
    if not (looks_local(name) or path.exists()):
        return None
    if not path.is_dir():
        raise UserError(f"--model {name}: no such directory")
    if not (path / "config.json").exists():
        raise UserError(f"--model {name}: {path} has no config.json; pass a Hugging Face model "
                        "directory (config.json, *.safetensors, tokenizer files)")
    return path


def _checked(path: Path, name: str, remedy: str) -> str:
    """``path`` once its files read (`model.model_dir_problem`); else the UserError naming
    the file, what is wrong and ``remedy``."""
    problem = model_dir_problem(path)
    if problem is not None:
        raise UserError(f"--model {name}: {path}: {problem}; {remedy}")
    return str(path)


def _downloaded(name: str, cache_dir: str | None) -> str:
    path = Path(_download(name, cache_dir))
    if not list(path.glob("*.safetensors")):
        raise UserError(f"--model {name}: the repo has no *.safetensors weights; convert the "
                        "checkpoint to safetensors first")
    # snapshot_download reuses what its cache holds: a damaged file stays until removed
    return _checked(path, name, f"delete {path.parents[1]} so that it is downloaded again")


def check_model_name(name: str) -> None:
    """A --model given as a local directory that is not there, or has no config.json: refused
    before the node check (a Hub id or the tiny preset is checked where it is fetched)."""
    if name != TINY_MODEL:
        _local_model_dir(name)


def fetch_model(name: str, cache_dir: str | None, seed: int, env: DistEnv) -> Path:
    """Return a local directory with the model's config, safetensors and tokenizer, its files
    checked by each node's first process (a damaged copy is one error on every rank, before
    the data is tokenized)."""
    if name == TINY_MODEL:
        target = tiny.directory(cache_dir, seed)

        def write_tiny() -> str:
            try:
                written = tiny.materialize(target, seed)
            except OSError as e:
                raise _cache_error(cache_dir, e) from None
            return _checked(written, name, f"delete {target} so that the preset is written again")

        return Path(on_node_leader_first(env, write_tiny))
    local = _local_model_dir(name)
    if local is not None:
        return Path(on_node_leader_first(env, lambda: _checked(
            local, name, "copy the model directory again from its source")))
    return Path(on_node_leader_first(env, lambda: _downloaded(name, cache_dir)))
