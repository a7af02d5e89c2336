"""Shared fixtures: every stack file of the repository, run once per session under mocks."""

from __future__ import annotations

import os

import pytest

from tests.harness import STACKS, Recording, run_program, stack_config


@pytest.fixture(scope="session", params=STACKS)
def stack(request) -> str:
    """The name of each ``Pulumi.<stack>.yaml`` in the repository."""
    return request.param


_RECORDINGS: dict[str, Recording] = {}


def recording_of(stack: str) -> Recording:
    """The whole program run under mocks for ``stack`` (cached: runs once per stack)."""
    if stack not in _RECORDINGS:
        _RECORDINGS[stack] = run_program(stack_config(stack), stack)
    return _RECORDINGS[stack]


@pytest.fixture(scope="session")
def recording(stack: str) -> Recording:
    """The whole program run under mocks for each stack file."""
    return recording_of(stack)


def _fresh_event_loop_after_fork() -> None:
    """mutmut (docs/testing.md) runs each mutant in a fork of the process that ran the clean
    tests. The parent's asyncio loop keeps its default thread pool, whose threads a forked child
    does not have: a Pulumi mock run in the child would wait on it forever. The child gets a loop
    of its own."""
    import asyncio

    asyncio.set_event_loop(asyncio.new_event_loop())


if "MUTANT_UNDER_TEST" in os.environ:  # set by mutmut only
    os.register_at_fork(after_in_child=_fresh_event_loop_after_fork)
