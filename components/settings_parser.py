"""Stack configuration -> one frozen, validated ``Settings`` object.

This module is the only reader of ``pulumi.Config``. It parses every ``fsdp-eks:*`` key of the
stack file into the typed, keyword-only dataclasses of ``components/settings.py``, rejects
unknown keys, then runs every rule of ``components/settings_rules/`` and raises one
``SettingsError`` listing every problem at once: the key, the bad value and the fix. It runs at
preview, before anything is created.

The job's training keys are the training package's own fields (``training/config.py``): each
``job.<camelCase>`` key is parsed with the field's type and validated by the package's own rules,
so the stack can accept nothing the pod would refuse.

The parsing half (``parse_settings``) is pure: tests call it with plain dictionaries.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, Union

from components.planning.hardware import PROFILES
from components.settings import (
    NAMESPACE,
    SCALAR_KEYS,
    SECRET_KEYS,
    SECTIONS,
    STACK_OWNED_TRAINING_FIELDS,
    JobSettings,
    Problem,
    Secrets,
    Settings,
    SettingsError,
    training_defaults,
)
from components.settings_rules import RULES, WARNINGS
from training import config as training_config

UNITS = {"gib": "GiB", "tib": "TiB"}
"""Units spelt as units in camelCase keys (``prometheusStorageGiB``, ``fsxThroughputPerTiB``)."""


def snake(name: str) -> str:
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    for unit in UNITS:  # "GiB" splits into "gi_b": join it back
        snake = re.sub(rf"{unit[:2]}_{unit[2:]}(?=_|$)", unit, snake)
    return snake


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(UNITS.get(part, part.title()) for part in rest)


def _coerce(value: Any, hint: Any, key: str, problems: list[Problem]) -> Any:
    """Check ``value`` against a type hint; return it converted, or None with a problem."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _coerce(value, options[0], key, problems)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            problems.append(Problem(key, value, f"use one of {', '.join(map(str, allowed))}"))
            return None
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            problems.append(Problem(key, value, "give a list of strings"))
            return ()
        return tuple(value)
    if dataclasses.is_dataclass(hint):
        return _parse_dataclass(value, hint, key, problems)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
        problems.append(Problem(key, value, f"must be {names.get(hint, hint.__name__)}"))
        return None
    return value


def _null_allowed(value: Any, hint: Any) -> bool:
    """``value`` is null and the field takes null (``maxSteps: null``). A null where the field
    does not (``nodes:`` left empty) is a problem ``_coerce`` reported: the field is left out, so
    the rules still run on its default instead of failing on None."""
    return value is None and type(None) in typing.get_args(hint)


def _parse_dataclass(raw: Any, cls: type, key: str, problems: list[Problem]) -> Any:
    """Build ``cls`` from a camelCase mapping; unknown keys and wrong types become problems."""
    if not isinstance(raw, Mapping):
        problems.append(Problem(key, raw, f"must be an object with keys of {cls.__name__}"))
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for raw_key, value in raw.items():
        name = snake(raw_key)
        if name not in fields or camel(name) != raw_key:  # exact spelling only
            known = ", ".join(camel(f) for f in fields)
            problems.append(Problem(f"{key}.{raw_key}", value, f"unknown key; known: {known}"))
            continue
        coerced = _coerce(value, hints[name], f"{key}.{raw_key}", problems)
        if coerced is not None or _null_allowed(value, hints[name]):
            kwargs[name] = coerced
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    for name in missing:
        problems.append(Problem(f"{key}.{camel(name)}", None, "required"))
    return cls(**kwargs) if not missing else None


def section_keys(cls: type) -> list[str]:
    """The keys a stack file may give in the section parsed into ``cls``.

    For the job: its own fields and every training field the stack does not own.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    if cls is JobSettings:
        names.remove("training")
        names += [n for n in training_config.fields() if n not in STACK_OWNED_TRAINING_FIELDS]
    return [camel(n) for n in names]


def _stack_key(name: str) -> str:
    """The stack key of a training field: ``seq_len`` -> ``job.seqLen``."""
    return f"job.{camel(name)}"


def _in_stack_terms(text: str) -> str:
    """A training-package message with its flags spelt as stack keys (``--sharding`` -> ``job.sharding``)."""
    known = training_config.fields()
    return re.sub(r"--([a-z0-9-]+)",
                  lambda m: _stack_key(m[1].replace("-", "_")) if m[1].replace("-", "_") in known else m[0],
                  text)


def _parse_training(raw: Mapping[str, Any], problems: list[Problem]) -> training_config.JobConfig | None:
    """The training keys of ``job`` -> the package's ``JobConfig``, validated by its own rules."""
    hints = training_config.field_types()
    values = training_defaults([snake(k) for k in raw])
    for raw_key, value in raw.items():
        name = snake(raw_key)
        if name in STACK_OWNED_TRAINING_FIELDS:
            problems.append(Problem(f"job.{raw_key}", value,
                                    "set by the stack (the pod's volumes and ports, the node check's "
                                    "thresholds from the profile): remove it"))
            continue
        coerced = _coerce(value, hints[name], f"job.{raw_key}", problems)
        if coerced is not None or _null_allowed(value, hints[name]):
            values[name] = coerced
    try:
        return training_config.from_fields(values)
    except training_config.ConfigError as e:
        problems.extend(Problem(_stack_key(p.key), values.get(p.key), _in_stack_terms(p.fix))
                        for p in e.problems)
        return None


def _parse_job(raw: Any, problems: list[Problem]) -> JobSettings | None:
    """``job``: the training package's fields and the job's own (nodes, rendezvous ...)."""
    if not isinstance(raw, Mapping):
        problems.append(Problem("job", raw, "must be an object with keys of JobSettings"))
        return None
    own_keys = [camel(f.name) for f in dataclasses.fields(JobSettings) if f.name != "training"]
    own, train = {}, {}
    for raw_key, value in raw.items():
        if raw_key in own_keys:
            own[raw_key] = value
        elif camel(snake(raw_key)) == raw_key and snake(raw_key) in training_config.fields():
            train[raw_key] = value  # a stack-owned field is refused with its reason
        else:  # exact spelling only
            known = ", ".join(section_keys(JobSettings))
            problems.append(Problem(f"job.{raw_key}", value, f"unknown key; known: {known}"))
    training = _parse_training(train, problems)
    job = _parse_dataclass(own, JobSettings, "job", problems)
    return None if job is None or training is None else dataclasses.replace(job, training=training)


MISPLACED_SECRETS = {"observability": {"alertSlackWebhook": "alertSlackWebhook"}}
"""Secrets a user may put inside a section, where they would be plain text: section -> key -> the
top-level secret key to use instead."""


def _misplaced_secrets(raw: Mapping[str, Any]) -> list[Problem]:
    """A secret written into a section (plain text in the stack file): refused, naming the secret key.

    The key is dropped from the section by ``_without_misplaced_secrets`` so the rest still parses.
    """
    return [
        Problem(f"{section}.{key}", "(not shown)",
                f"a secret: remove it from the stack file and run `pulumi config set --secret {secret} <value>`")
        for section, keys in MISPLACED_SECRETS.items() if isinstance(raw.get(section), Mapping)
        for key, secret in keys.items() if key in raw[section]
    ]


def _without_misplaced_secrets(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        section: ({k: v for k, v in value.items() if k not in MISPLACED_SECRETS.get(section, {})}
                  if isinstance(value, Mapping) else value)
        for section, value in raw.items()
    }


def settings_warnings(settings: Settings) -> list[Problem]:
    """What preview warns about without refusing the stack (``settings_rules.WARNINGS``)."""
    return [w for rule in WARNINGS for w in rule(settings)]


def parse_settings(
    raw: Mapping[str, Any],
    *,
    project: str,
    stack: str,
    region: str,
    secrets: Secrets | None = None,
) -> Settings:
    """Turn the ``fsdp-eks:*`` keys of a stack (without namespace, values parsed) into Settings.

    Raises ``SettingsError`` listing every problem found: parsing and validation both.
    """
    problems: list[Problem] = _misplaced_secrets(raw)
    raw = _without_misplaced_secrets(raw)
    for key in raw:
        if key not in SECTIONS and key not in SCALAR_KEYS and key not in SECRET_KEYS:
            known = ", ".join([*SCALAR_KEYS, *SECTIONS, *SECRET_KEYS])
            problems.append(Problem(key, raw[key], f"unknown key; known: {known}"))
    profile_name = raw.get("profile", "")
    profile = PROFILES.get(profile_name)
    if profile is None:
        problems.append(
            Problem("profile", profile_name, f"use one of {', '.join(PROFILES)} (components/planning/hardware.py)")
        )
    sections = {
        key: _parse_job(raw.get(key, {}), problems) if cls is JobSettings
        else _parse_dataclass(raw.get(key, {}), cls, key, problems)
        for key, cls in SECTIONS.items()
    }
    if profile is None or any(section is None for section in sections.values()):
        # The rules need a profile and every section; without them, report what parsing found.
        # (A value of the wrong type or an unknown key is left out, so the rules still run.)
        raise SettingsError(stack, problems)
    settings = Settings(
        project=project,
        stack=stack,
        region=region,
        profile_name=profile_name,
        profile=profile,
        network=sections["network"],
        cluster=sections["cluster"],
        gpu_nodes=sections["gpuNodes"],
        job=sections["job"],
        observability=sections["observability"],
        storage=sections["storage"],
        secrets=secrets or Secrets(),
    )
    for rule in RULES:
        problems.extend(rule(settings))
    if problems:
        raise SettingsError(stack, problems)
    return settings


# --------------------------------------------------------------------------- the Pulumi reader


def load_settings() -> Settings:
    """Read the current stack's configuration through ``pulumi.Config``: the only reader."""
    import pulumi
    from pulumi.runtime import config as runtime_config

    config = pulumi.Config(NAMESPACE)
    prefix = f"{NAMESPACE}:"
    keys = {*runtime_config.CONFIG.get(), *runtime_config.get_config_env()}
    raw: dict[str, Any] = {}
    for full_key in sorted(keys):
        if not full_key.startswith(prefix) or full_key[len(prefix):] in SECRET_KEYS:
            continue
        key = full_key[len(prefix):]
        text = config.get(key)
        try:
            raw[key] = json.loads(text)
        except (TypeError, json.JSONDecodeError):
            raw[key] = text
    secrets = Secrets(
        hf_token=config.get_secret("hfToken"),
        grafana_admin_password=config.get_secret("grafanaAdminPassword"),
        alert_slack_webhook=config.get_secret("alertSlackWebhook"),
    )
    region = pulumi.Config("aws").get("region") or ""
    settings = parse_settings(
        raw, project=pulumi.get_project(), stack=pulumi.get_stack(), region=region, secrets=secrets
    )
    for warning in settings_warnings(settings):
        pulumi.log.warn(str(warning))
    return settings
