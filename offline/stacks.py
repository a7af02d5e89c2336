"""The repository's stack files as the offline runs read them: their configuration, dummy
secrets in place of the user's, and example values for what each user must set themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from components.planning.hardware import PROFILES, HardwareProfile
from components.settings import Problem, SettingsError

ROOT = Path(__file__).resolve().parent.parent
STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in ROOT.glob("Pulumi.*.yaml"))
# Stand-ins for the secrets a user sets with `pulumi config set --secret` (never committed).
DUMMY_SECRETS = {"fsdp-eks:hfToken": "hf_dummy_token_offline", "fsdp-eks:grafanaAdminPassword": "dummy-grafana-pw"}


def secure(value: str) -> dict[str, str]:
    """A secret as ``pulumi config set --secret`` writes it into the stack file, ``{secure: ...}``;
    offline the plain value stands where the file has the ciphertext. A value without it is plain
    text in the file, as the program sees it at preview (``offline.mocks.run_program``)."""
    return {"secure": value}


def is_secure(value: Any) -> bool:
    """``value`` is a secret as ``secure`` writes one."""
    return isinstance(value, dict) and set(value) == {"secure"}


EXAMPLE_RESERVATION_ID = "cr-0123456789abcdef0"
"""A made-up capacity reservation id, for the offline plan only."""


def examples_for(profile: HardwareProfile) -> dict[str, dict[str, Any]]:
    """Section -> key -> the example values the offline plan (never `pulumi up`) supplies for
    what each user of ``profile`` must set themselves. A type sold only through capacity
    reservations has no id in its stack file (a made-up one passes preview and fails half an
    hour into `pulumi up`): preview asks for the user's, the offline plan uses this example."""
    return {"gpuNodes": {"capacityReservationId": EXAMPLE_RESERVATION_ID}} if profile.reservation_only else {}


def offline_examples(config: dict[str, Any]) -> dict[str, Any]:
    """The example values ``config`` lacks, as ``{"section.key": value}`` (what the plan prints);
    none for a section that is not a mapping (preview names it)."""
    name = config.get("fsdp-eks:profile")
    profile = PROFILES.get(name) if isinstance(name, str) else None
    examples = {}
    for section, values in (examples_for(profile) if profile else {}).items():
        given = config.get(f"fsdp-eks:{section}", {})
        if isinstance(given, dict):
            examples.update({f"{section}.{k}": v for k, v in values.items() if k not in given})
    return examples


def stack_file_config(stack: str) -> dict[str, Any]:
    """The ``config:`` block of ``Pulumi.<stack>.yaml`` as committed (values parsed).

    Raises ``SettingsError`` for a file that is no stack file: not YAML, a ``config:`` that is not
    a mapping, or a key without its namespace (Pulumi reads a key as ``<namespace>:<name>`` and
    refuses any other: pulumi/pulumi, sdk/go/common/resource/config/key.go, ``ParseKey``).
    """
    name = f"Pulumi.{stack}.yaml"
    try:
        with (ROOT / name).open(encoding="utf-8") as stream:  # the error names the file and line
            document = yaml.safe_load(stream)
    except yaml.YAMLError as error:
        raise SettingsError(stack, [Problem("(stack file)", name, f"is not valid YAML: {error}")]) from None
    config = document.get("config") if isinstance(document, dict) else None
    if not isinstance(config, dict):
        found = {type(None): "nothing", str: "a string", list: "a list"}.get(type(config), type(config).__name__)
        raise SettingsError(stack, [Problem("(stack file)", f"config: {found}",
                                            "must be a mapping, one `<namespace>:<key>: value` line each "
                                            "(`fsdp-eks:profile: p5`, `aws:region: us-west-2`)")])
    bare = [key for key in config if ":" not in str(key)]
    if bare:
        raise SettingsError(stack, [Problem("(stack file)", f"config: {key}", f"a key needs its namespace: "
                                            f"`fsdp-eks:{key}` (or `aws:{key}` for the AWS provider's)")
                                    for key in bare])
    return config


def stack_config(stack: str) -> dict[str, Any]:
    """The ``config:`` block of ``Pulumi.<stack>.yaml`` plus the offline examples it lacks and
    dummy secrets for the secret keys it does not give (values parsed; a secret the file gives in
    plain text stays so, and preview refuses it)."""
    config = stack_file_config(stack)
    committed = [k for k, v in config.items() if isinstance(v, dict) and "secure" in v]
    if committed:
        raise SettingsError(stack, [Problem("(stack file)", key, "an encrypted value, which the offline plan "
                                            "cannot read: plan a copy of the stack file without it (a dummy "
                                            "stands in for each secret key)") for key in committed])
    return {**{key: secure(value) for key, value in DUMMY_SECRETS.items()}, **with_examples(config)}


def with_examples(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (keys with namespace) with the example values it lacks (``offline_examples``)."""
    config = dict(config)
    for dotted, value in offline_examples(config).items():
        section, key = dotted.split(".", 1)
        config[f"fsdp-eks:{section}"] = {**config.get(f"fsdp-eks:{section}", {}), key: value}
    return config
