"""The offline runner and the settings parser, as the tests use them, and Kubernetes rules the
tests apply."""

import copy

import pytest

from components.offline import DUMMY_SECRETS, STACKS, Recording, Registration, run_program, stack_config
from components.settings import SECRET_KEYS, Secrets, Settings, SettingsError, parse_settings

__all__ = ["DUMMY_SECRETS", "STACKS", "Recording", "Registration", "run_program", "stack_config", "tolerates",
           "SECRETS", "raw_settings", "parse", "settings_error"]

SECRETS = Secrets(hf_token="hf_x", grafana_admin_password="pw")


def raw_settings(stack: str) -> dict:
    """The fsdp-eks keys of a stack file, without namespace, secrets left out (a fresh copy)."""
    secret_keys = {f"fsdp-eks:{k}" for k in SECRET_KEYS}
    return {k.split(":", 1)[1]: copy.deepcopy(v) for k, v in stack_config(stack).items()
            if k.startswith("fsdp-eks:") and k not in secret_keys}


def parse(config: dict, secrets: Secrets = SECRETS) -> Settings:
    """``parse_settings`` as a preview of stack ``test`` would call it."""
    return parse_settings(config, project="fsdp-eks", stack="test", region="us-west-2", secrets=secrets)


def settings_error(config: dict, secrets: Secrets = SECRETS) -> SettingsError:
    """The error ``config`` must raise."""
    with pytest.raises(SettingsError) as info:
        parse(config, secrets)
    return info.value


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
