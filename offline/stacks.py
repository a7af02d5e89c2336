"""The repository's stack files as the offline runs read them: their configuration, dummy
secrets in place of the user's, and example values for what each user must set themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.planning.hardware import PROFILES, HardwareProfile

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
# Stand-ins for the secrets a user sets with `pulumi config set --secret` (never committed).
DUMMY_SECRETS = {"fsdp-eks:hfToken": "hf_dummy_token_offline", "fsdp-eks:grafanaAdminPassword": "dummy-grafana-pw"}


EXAMPLE_RESERVATION_ID = "cr-0123456789abcdef0"
"""A made-up capacity reservation id, for the offline plan only."""


def examples_for(profile: HardwareProfile) -> dict[str, dict[str, Any]]:
    """Section -> key -> the example values the offline plan (never `pulumi up`) supplies for
    what each user of ``profile`` must set themselves. A type sold only through capacity
    reservations has no id in its stack file (a made-up one passes preview and fails half an
    hour into `pulumi up`): preview asks for the user's, the offline plan uses this example."""
    return {"gpuNodes": {"capacityReservationId": EXAMPLE_RESERVATION_ID}} if profile.reservation_only else {}


def offline_examples(config: dict[str, Any]) -> dict[str, Any]:
    """The example values ``config`` lacks, as ``{"section.key": value}`` (what the plan prints)."""
    profile = PROFILES.get(config.get("fsdp-eks:profile", ""))
    examples = {}
    for section, values in (examples_for(profile) if profile else {}).items():
        given = config.get(f"fsdp-eks:{section}", {})
        examples.update({f"{section}.{k}": v for k, v in values.items() if k not in given})
    return examples


def stack_file_config(stack: str) -> dict[str, Any]:
    """The ``config:`` block of ``Pulumi.<stack>.yaml`` as committed (values parsed)."""
    return yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def stack_config(stack: str) -> dict[str, Any]:
    """The ``config:`` block of ``Pulumi.<stack>.yaml`` plus dummy secrets and the offline
    examples it lacks (values parsed)."""
    config = stack_file_config(stack)
    committed = [k for k, v in config.items() if isinstance(v, dict) and "secure" in v]
    if committed:
        raise ValueError(f"Pulumi.{stack}.yaml commits encrypted values for {committed}: remove them")
    return {**with_examples(config), **DUMMY_SECRETS}


def with_examples(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (keys with namespace) with the example values it lacks (``offline_examples``)."""
    config = dict(config)
    for dotted, value in offline_examples(config).items():
        section, key = dotted.split(".", 1)
        config[f"fsdp-eks:{section}"] = {**config.get(f"fsdp-eks:{section}", {}), key: value}
    return config
