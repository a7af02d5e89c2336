"""Stack configuration -> one frozen, validated ``Settings`` object.

This module is the only reader of ``pulumi.Config``. It parses every ``fsdp-eks:*`` key of the
stack file into the typed, keyword-only dataclasses of ``components/settings.py``, rejects
unknown keys (naming the key probably meant), then runs every rule of
``components/settings_rules/`` and raises one ``SettingsError`` listing every problem at once:
the key, the bad value and the fix. A value it cannot read does not stop the rules: they run on
the rest. A value that may be a secret is never repeated in a problem (how a problem is told:
``components/settings_problems.py``). It runs at preview, before anything is created.

The job's training keys are the training package's own fields (``training/config.py``): each
``job.<camelCase>`` key is parsed with the field's type and validated by the package's own rules,
so the stack can accept nothing the pod would refuse.

The parsing half (``parse_settings``) is pure: tests call it with plain dictionaries.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, Literal, Union

from components.planning.hardware import PROFILES
from components.preflight import account_problems
from components.settings import (
    NAMESPACE,
    SCALAR_KEYS,
    SECRET_KEYS,
    SECTIONS,
    STACK_OWNED_TRAINING_FIELDS,
    ClusterSettings,
    GpuNodeSettings,
    JobSettings,
    NetworkSettings,
    ObservabilitySettings,
    Problem,
    Secrets,
    Settings,
    SettingsError,
    StorageSettings,
    training_defaults,
)
from components.settings_problems import (
    HIDDEN,
    dotted,
    is_near_namespace,
    names_any,
    one_of,
    secret_key_named,
    shown,
    suggestion,
)
from components.settings_rules import RULES, WARNINGS
from training import config as training_config

INT32_MAX = 2**31 - 1
"""The largest integer a Kubernetes ``int32`` field or an AWS API ``Integer`` takes."""
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
        if isinstance(value, str) and not value.strip() and options[0] is str:  # unset is None, not ""
            problems.append(Problem(key, value, "is empty: give a value, or remove the key (unset is none)"))
            return None
        return None if value is None else _coerce(value, options[0], key, problems)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            problems.append(Problem(key, value, one_of(value, {str(a): str(a) for a in allowed})))
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
        if not math.isfinite(value):  # YAML's .nan and .inf
            problems.append(Problem(key, value, "must be a finite number"))
            return None
        return float(value)
    if hint is int and isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > INT32_MAX:
        problems.append(Problem(key, value, f"must be a whole number of at most {INT32_MAX} (Kubernetes and AWS "
                                            "take 32-bit integers)"))
        return None
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint is str and isinstance(value, bool | int | float):
        read_as = "true or false" if isinstance(value, bool) else "a number"
        problems.append(Problem(key, value, f"must be a string: quote it in the stack file (YAML reads an "
                                            f"unquoted {value!r} as {read_as})"))
        return None
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
        unquote = ": write it without quotes in the stack file" if isinstance(value, str) and _reads_as(value, hint) else ""
        problems.append(Problem(key, value, f"must be {names.get(hint, hint.__name__)}{unquote}"))
        return None
    return value


def _reads_as(text: str, hint: Any) -> bool:
    """``text`` is a ``hint`` value in quotes (``"2"`` for a whole number, ``"true"``)."""
    if hint is bool:
        return text.strip().lower() in ("true", "false")
    try:
        return hint in (int, float) and float(text) == hint(float(text))
    except (ValueError, OverflowError):
        return False


def _null_allowed(value: Any, hint: Any) -> bool:
    """``value`` is null and the field takes null (``maxSteps: null``). A null where the field
    does not (``nodes:`` left empty) is a problem ``_coerce`` reported: the field is left out, so
    the rules still run on its default instead of failing on None."""
    return value is None and type(None) in typing.get_args(hint)


def _not_an_object(key: str, value: Any, known: list[str]) -> Problem:
    """A section (or a structured key) that is not a YAML object of keys."""
    what = "is empty: give its keys on the lines under it, or remove it" if value is None else "must be an object"
    return Problem(key, value, f"{what} (key: value pairs; known keys: {', '.join(known)})")


def _parse_dataclass(raw: Any, cls: type, key: str, problems: list[Problem], **parsed: Any) -> Any:
    """Build ``cls`` from a camelCase mapping; unknown keys and wrong types become problems.
    ``parsed``: fields already built from other keys, by name."""
    if not isinstance(raw, Mapping):
        problems.append(_not_an_object(key, raw, section_keys(cls)))
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for raw_key, value in raw.items():
        name = snake(raw_key)
        if name not in fields or camel(name) != raw_key:  # exact spelling only
            problems.append(_unknown_key(key, raw_key, value, [camel(f) for f in fields]))
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
        if camel(name) not in raw:  # a value given but refused was named above
            problems.append(Problem(f"{key}.{camel(name)}", None, "required"))
    return cls(**kwargs, **parsed) if not missing else None


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
        refused = {p.key for p in e.problems}
    try:  # the rest, for the rules: the refused fields at their defaults
        return training_config.from_fields({k: v for k, v in values.items() if k not in refused})
    except training_config.ConfigError:
        return None


def _parse_job(raw: Any, problems: list[Problem]) -> JobSettings | None:
    """``job``: the training package's fields and the job's own (nodes, rendezvous ...)."""
    if not isinstance(raw, Mapping):
        problems.append(_not_an_object("job", raw, section_keys(JobSettings)))
        return None
    own_keys = [camel(f.name) for f in dataclasses.fields(JobSettings) if f.name != "training"]
    own, train = {}, {}
    for raw_key, value in raw.items():
        if raw_key in own_keys:
            own[raw_key] = value
        elif camel(snake(raw_key)) == raw_key and snake(raw_key) in training_config.fields():
            train[raw_key] = value  # a stack-owned field is refused with its reason
        else:  # exact spelling only
            problems.append(_unknown_key("job", raw_key, value, section_keys(JobSettings)))
    training = _parse_training(train, problems)
    if training is None:  # the job's own keys still get their problems named
        _parse_dataclass(own, JobSettings, "job", problems)
        return None
    # Built with the parsed config, not the default one: the package's rules run once per preview.
    return _parse_dataclass(own, JobSettings, "job", problems, training=training)


TOP_LEVEL_KEYS = [*SCALAR_KEYS, *SECTIONS, *SECRET_KEYS]
"""The keys of the stack file's namespace (``fsdp-eks:<key>``)."""

def _keys_by_section() -> dict[str | None, list[str]]:
    """Every key a stack file may give: None -> the top-level keys, section -> its keys."""
    return {None: TOP_LEVEL_KEYS, **{section: section_keys(cls) for section, cls in SECTIONS.items()}}


def _unknown_key(section: str | None, raw_key: str, value: Any, known: list[str]) -> Problem:
    """The problem of a key the stack does not know: a secret written where it would be plain text
    (refused, naming the secret key to set), or a misspelt or misplaced key with what was meant."""
    key = dotted(section, raw_key)
    secret = secret_key_named(raw_key)
    if secret is not None:
        return Problem(key, HIDDEN, "a secret, here in plain text in the stack file: remove it and run "
                                    f"`pulumi config set --secret {secret} <value>`")
    head, dot, rest = raw_key.partition(".")
    if section is None and dot and head in SECTIONS:  # `pulumi config set job.nodes 2`, without --path
        return Problem(key, value, f"set without --path: the stack file has a key named {raw_key!r}, not "
                                   f"{rest} inside {head}. Run `pulumi config rm {raw_key}` and "
                                   f"`pulumi config set --path {raw_key} <value>`")
    hint = suggestion(section, raw_key, known, _keys_by_section())
    return Problem(key, value, f"unknown key{hint}; known: {', '.join(known)}")


def _plaintext_secret(stack: str, key: str) -> Problem:
    """A secret key whose value the stack file holds in plain text (set without ``--secret``)."""
    return Problem(key, HIDDEN, f"stored in plain text in Pulumi.{stack}.yaml: run `pulumi config rm {key}` and "
                                f"`pulumi config set --secret {key} <value>` (and replace the value: it was readable "
                                "by anyone with the file)")


def _is_ours_elsewhere(key: str) -> bool:
    """``key`` (``namespace:name``) is one of ours under another namespace: a misspelt one
    (``fsdp_eks:job``), or a provider's with a name only we use (``aws:gpuNodes``; ``aws:profile``
    is the AWS provider's own)."""
    namespace, _, name = key.partition(":")
    return is_near_namespace(namespace) or (namespace != NAMESPACE and name in TOP_LEVEL_KEYS
                                            and name not in SCALAR_KEYS)


def _foreign_namespace(key: str) -> Problem:
    """A key of ours under another namespace: the program reads only ``fsdp-eks:`` keys, so it is ignored."""
    namespace, _, name = key.partition(":")
    return Problem(f"({key})", namespace, f"not the project's namespace, so the key is ignored: write "
                                          f"{NAMESPACE}:{name}")


def settings_warnings(settings: Settings) -> list[Problem]:
    """What preview warns about without refusing the stack (``settings_rules.WARNINGS``)."""
    return [shown(w) for rule in WARNINGS for w in rule(settings)]


def parse_settings(
    raw: Mapping[str, Any],
    *,
    project: str,
    stack: str,
    region: str,
    secrets: Secrets | None = None,
    plaintext_secrets: Collection[str] = (),
    other_keys: Collection[str] = (),
) -> Settings:
    """Turn the ``fsdp-eks:*`` keys of a stack (without namespace, values parsed) into Settings.

    Raises ``SettingsError`` listing every problem found: parsing and validation both
    (``read_settings``, whose arguments these are).
    """
    settings, problems = read_settings(raw, project=project, stack=stack, region=region, secrets=secrets,
                                       plaintext_secrets=plaintext_secrets, other_keys=other_keys)
    if problems:
        raise SettingsError(stack, problems)
    return settings


def read_settings(
    raw: Mapping[str, Any],
    *,
    project: str,
    stack: str,
    region: str,
    secrets: Secrets | None = None,
    plaintext_secrets: Collection[str] = (),
    other_keys: Collection[str] = (),
) -> tuple[Settings, list[Problem]]:
    """The Settings of a stack's ``fsdp-eks:*`` keys (without namespace, values parsed) and every
    problem found, parsing and validation both, each as preview prints it.

    ``plaintext_secrets``: the secret keys the stack file holds without ``--secret``;
    ``other_keys``: the stack's keys of other namespaces (``aws:region``), for a misspelt namespace.
    A value that cannot be read (a wrong type, an unknown profile, a section that is not an object)
    is named, and the rules still run on the rest: with the default in its place, keeping only the
    problems that do not name it; with an unknown profile, the problems every profile has (the
    Settings returned then carry the first profile: use them only when there is no problem).
    """
    problems = [_unknown_key(None, key, value, TOP_LEVEL_KEYS) for key, value in raw.items()
                if key not in TOP_LEVEL_KEYS]
    problems += [_plaintext_secret(stack, key) for key in plaintext_secrets]
    problems += [_foreign_namespace(key) for key in other_keys if _is_ours_elsewhere(key)]
    profile_name = raw.get("profile")
    profile = PROFILES.get(profile_name) if isinstance(profile_name, str) else None
    if profile is None:
        problems.append(_unknown_profile(profile_name))
    sections = {
        key: _parse_job(raw.get(key, {}), problems) if cls is JobSettings
        else _parse_dataclass(raw.get(key, {}), cls, key, problems)
        for key, cls in SECTIONS.items()
    }
    unread = {p.key for p in problems}
    candidates = {profile_name: profile} if profile is not None else PROFILES
    runs = []
    for name, candidate in candidates.items():
        settings = Settings(project=project, stack=stack, region=region, profile_name=name, profile=candidate,
                            secrets=secrets or Secrets(), **_sections_or_defaults(sections))
        runs.append((settings, [p for rule in RULES for p in rule(settings)]))
    everywhere = set.intersection(*({str(p) for p in found} for _, found in runs))
    problems += [p for p in runs[0][1] if str(p) in everywhere and not names_any(p, unread)]
    return runs[0][0], [shown(p) for p in problems]


def _unknown_profile(profile_name: object) -> Problem:
    """A profile no row has: the known ones, each with its instance type."""
    instance_types = {name: row.instance_type for name, row in PROFILES.items()}
    return Problem("profile", profile_name,
                   f"{one_of(profile_name, instance_types)} (components/planning/hardware.py: "
                   f"{', '.join(f'{n} is {t}' for n, t in instance_types.items())})")


def _sections_or_defaults(sections: Mapping[str, Any]) -> dict[str, Any]:
    """The parsed sections as ``Settings`` fields, a section that could not be read at its defaults."""
    return {
        "network": sections["network"] or NetworkSettings(),
        "cluster": sections["cluster"] or ClusterSettings(),
        "gpu_nodes": sections["gpuNodes"] or GpuNodeSettings(),
        "job": sections["job"] or JobSettings(),
        "observability": sections["observability"] or ObservabilitySettings(),
        "storage": sections["storage"] or StorageSettings(),
    }


def _account_problems_beside(settings: Settings, problems: list[Problem]) -> list[Problem]:
    """What the account says of settings that have problems already, so that one preview lists
    both: asked only when the profile and the region were read, and keeping only what names no key
    already named. An account that cannot be asked (no credentials) leaves the file's problems
    alone, with a warning: they must not wait for the account."""
    import pulumi

    named = {p.key for p in problems}
    if {"profile", "(aws:region)"} & named:
        return []
    try:
        found, _ = account_problems(settings)
    except Exception as error:  # an invoke's failure: any type the provider raises
        pulumi.log.warn(f"the AWS account was not asked about this configuration ({error}); "
                        "its checks run once the problems below are fixed")
        return []
    return [shown(p) for p in found if not names_any(p, named)]


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
    given = [key for key in SECRET_KEYS if f"{prefix}{key}" in keys]
    encrypted = {*runtime_config.get_config_secret_keys_env()}
    plaintext = [key for key in given
                 if not runtime_config.is_config_secret(f"{prefix}{key}") and f"{prefix}{key}" not in encrypted]

    def secret(key: str) -> Any:
        """The secret ``key`` as a Pulumi secret; None when unset or empty (the rules then ask for it)."""
        return config.get_secret(key) if str(runtime_config.get_config(f"{prefix}{key}") or "").strip() else None

    secrets = Secrets(
        hf_token=secret("hfToken"),
        grafana_admin_password=secret("grafanaAdminPassword"),
        alert_slack_webhook=secret("alertSlackWebhook"),
    )
    region = pulumi.Config("aws").get("region") or ""
    settings, problems = read_settings(
        raw, project=pulumi.get_project(), stack=pulumi.get_stack(), region=region, secrets=secrets,
        plaintext_secrets=plaintext, other_keys=[key for key in keys if not key.startswith(prefix)],
    )
    if problems:  # with what the account says (else build_stack's preflight asks it)
        raise SettingsError(settings.stack, problems + _account_problems_beside(settings, problems))
    for warning in settings_warnings(settings):
        pulumi.log.warn(str(warning))
    return settings
