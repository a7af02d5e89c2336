"""Shared fixtures: every stack file of the repository, run once per session under mocks."""

from __future__ import annotations

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
