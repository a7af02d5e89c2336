"""The offline runner, as the tests use it."""

from components.offline import DUMMY_SECRETS, STACKS, Recording, Registration, run_program, stack_config

__all__ = ["DUMMY_SECRETS", "STACKS", "Recording", "Registration", "run_program", "stack_config"]
