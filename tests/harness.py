"""The offline runner, as the tests use it, and Kubernetes rules the tests apply."""

from components.offline import DUMMY_SECRETS, STACKS, Recording, Registration, run_program, stack_config

__all__ = ["DUMMY_SECRETS", "STACKS", "Recording", "Registration", "run_program", "stack_config", "tolerates"]


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Kubernetes' matching of a taint by a toleration list (an empty effect matches all)."""
    for t in tolerations:
        if t.get("operator") == "Exists":
            key_ok = t.get("key") in (None, taint["key"])
        else:
            key_ok = t.get("key") == taint["key"] and t.get("value") == taint["value"]
        if key_ok and t.get("effect") in (None, "", taint["effect"]):
            return True
    return False
