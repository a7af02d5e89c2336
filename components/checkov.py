"""Checkov's inline skips: where a rendered object cannot meet a check, the reason sits on it.

Checkov (kubernetes framework) honours ``checkov.io/skip<N>: <CHECK_ID>=<reason>`` annotations on
an object's metadata, so any run over the objects the program renders (``make plan``) reports the
check as skipped with its reason instead of failed, without a separate list to keep in step.
"""

from __future__ import annotations

from collections.abc import Mapping


def skip_annotations(skips: Mapping[str, str]) -> dict[str, str]:
    """``{"CKV_K8S_116": "reason"}`` -> ``{"checkov.io/skip1": "CKV_K8S_116=reason"}``."""
    return {f"checkov.io/skip{i}": f"{check}={reason}" for i, (check, reason) in enumerate(skips.items(), start=1)}
