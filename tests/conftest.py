"""Shared fixtures: every stack file of the repository, run once per session under mocks."""

from __future__ import annotations

import functools
import os
import sys

import pytest

from tests.harness import STACKS, Recording, run_program, stack_config


@pytest.fixture(scope="session", params=STACKS)
def stack(request) -> str:
    """The name of each ``Pulumi.<stack>.yaml`` in the repository."""
    return request.param


@functools.cache
def recording_of(stack: str) -> Recording:
    """The whole program run under mocks for ``stack`` (cached: runs once per stack)."""
    return run_program(stack_config(stack), stack)


@pytest.fixture(scope="session")
def recording(stack: str) -> Recording:
    """The whole program run under mocks for each stack file."""
    return recording_of(stack)


def _fresh_state_after_fork() -> None:
    """mutmut (docs/testing.md) runs each mutant in a fork of the process that ran the clean
    tests. The child must not reuse what the parent computed with the unmutated code (the cached
    program runs, the training package's cached parser), and the parent's asyncio loop keeps a
    thread pool whose threads a forked child does not have: a Pulumi mock run would wait on it
    forever. So every functools cache of ours is cleared and the child gets a loop of its own."""
    import asyncio

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("components", "training", "tests"):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()
    asyncio.set_event_loop(asyncio.new_event_loop())


if "MUTANT_UNDER_TEST" in os.environ:  # set by mutmut only
    os.register_at_fork(after_in_child=_fresh_state_after_fork)
