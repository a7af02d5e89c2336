"""How a settings problem is told: the key or choice probably meant, and never a secret's value.

Pure helpers of ``components/settings_parser.py``: near-miss spellings (case, ``_`` and ``-``
ignored, close spellings, a key in another section), which values are hidden (named or shaped
like a secret), and whether a problem names a key already reported.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Collection, Mapping
from typing import Any

from components.settings import NAMESPACE, SECRET_KEYS, Problem


HIDDEN = "(not shown)"
"""What a problem shows in place of a value that may be a secret."""
SECRET_NAME = re.compile(r"token|password|passwd|secret|webhook|api_?key|private_?key|credential", re.IGNORECASE)
"""A key named like a secret: its value is never shown, wherever it is."""
SECRET_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{8,}|hooks\.slack\.com/|-----BEGIN [A-Z ]*PRIVATE KEY")
"""A value that looks like one of the stack's secrets (a Hugging Face token, a Slack webhook) or a key."""
PROVIDER_KEYS = {"region": "aws:region"}
"""A key of another namespace that a stack file may give under ours (``fsdp-eks:region``)."""


def normalized(name: str) -> str:
    """A key as a near-miss spells it: case, ``_`` and ``-`` ignored (``batch_size`` is ``batchSize``)."""
    return re.sub(r"[-_\s]", "", name).lower()


def secret_key_named(name: str) -> str | None:
    """The secret key that ``name`` spells, however cased (``hf_token``, ``HFToken`` -> ``hfToken``)."""
    return next((k for k in SECRET_KEYS if normalized(k) == normalized(name)), None)


def one_of(value: Any, allowed: Mapping[str, str]) -> str:
    """The fix of a value that must be one of ``allowed`` (name -> what it is, when not just the
    name), with the one meant when ``value`` spells it otherwise (``full_shard``, ``BF16``) or
    names what it is (``p5.48xlarge``)."""
    meant = [name for name, what in allowed.items()
             if isinstance(value, str) and normalized(value) in (normalized(name), normalized(what))]
    return (f"did you mean {meant[0]}? " if meant else "") + f"use one of {', '.join(allowed)}"


def _may_be_secret(value: Any) -> bool:
    if isinstance(value, str):
        return bool(SECRET_VALUE.search(value))
    if isinstance(value, Mapping):
        return any(SECRET_NAME.search(str(k)) or _may_be_secret(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_may_be_secret(v) for v in value)
    return False


def shown(problem: Problem) -> Problem:
    """``problem`` as preview prints it: its value hidden where the key is named like a secret or
    the value looks like one (a token pasted into the wrong key must not reach the log)."""
    named_secret = SECRET_NAME.search(problem.key.rsplit(".", 1)[-1]) and problem.value is not None
    if problem.value != HIDDEN and (named_secret or _may_be_secret(problem.value)):
        return dataclasses.replace(problem, value=HIDDEN)
    return problem


def dotted(section: str | None, key: str) -> str:
    """A key as the stack file names it: ``section.key``, or ``key`` at the top level."""
    return key if section is None else f"{section}.{key}"


def suggestion(section: str | None, raw_key: str, known: list[str],
               keys_by_section: Mapping[str | None, list[str]]) -> str:
    """What ``raw_key`` was probably meant to be: the same key spelt otherwise, the key in another
    section (``gpuNodes.nodes`` -> ``job.nodes``), or a close spelling; "" when nothing is close."""
    same = [k for k in known if normalized(k) == normalized(raw_key)]
    if same:
        return f": did you mean {dotted(section, same[0])}?"
    elsewhere = [(s, k) for s, keys in keys_by_section.items() if s != section
                 for k in keys if normalized(k) == normalized(raw_key)]
    if elsewhere:
        where, key = elsewhere[0]
        return f": it belongs {'at the top level' if where is None else 'in ' + where}: {dotted(where, key)}"
    if section is None and normalized(raw_key) in PROVIDER_KEYS:
        return f": it belongs to the AWS provider: {PROVIDER_KEYS[normalized(raw_key)]}"
    close = difflib.get_close_matches(raw_key.lower(), [k.lower() for k in known], n=1, cutoff=0.8)
    if close:
        return f": did you mean {dotted(section, next(k for k in known if k.lower() == close[0]))}?"
    return ""


def is_near_namespace(namespace: str) -> bool:
    """``namespace`` is the project's misspelt (``fsdp_eks``, ``fsdpeks``, ``fsdp-ek``)."""
    return namespace != NAMESPACE and (
        normalized(namespace) == normalized(NAMESPACE)
        or difflib.SequenceMatcher(None, namespace.lower(), NAMESPACE).ratio() >= 0.8)


def names_any(problem: Problem, keys: Collection[str]) -> bool:
    """``problem`` is about one of ``keys`` or a key under one, or its fix names one (``gpuNodes.maxSize``
    in a fix names ``gpuNodes``)."""
    for key in keys:
        if problem.key == key or problem.key.startswith(f"{key}.") or key.startswith(f"{problem.key}."):
            return True
        if re.search(rf"(?<![\w.]){re.escape(key)}" + (r"(?!\w)" if "." in key else r"\.\w"), problem.fix):
            return True
    return False
