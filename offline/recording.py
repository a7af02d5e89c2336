"""What one run of the program registered, as the engine saw it, and the secret masking of
everything that is printed or written from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

@dataclass
class Registration:
    """One resource as the engine saw it."""

    type: str
    name: str
    inputs: dict[str, Any]
    provider: str | None
    dependencies: list[str] = field(default_factory=list)
    """Names of the resources it waits for (``depends_on`` and the resources its inputs come from)."""
    delete_before_replace: bool = False
    """Its ``delete_before_replace`` option: a replacement deletes the old one first."""
    ignore_changes: list[str] = field(default_factory=list)
    """Its ``ignore_changes`` option: properties a later ``pulumi up`` leaves as they are."""
    urn: str = ""
    """Its URN, as the engine builds it: the parent's type chain, its type, its name."""
    parent: str = ""
    """Its parent's URN."""
    aliases: list[str] = field(default_factory=list)
    """The URNs of its ``aliases`` option (what a stack's state may still know it by); those it
    inherits from its parent's aliases are not listed."""


@dataclass
class Recording:
    """What one run of the program registered and exported."""

    resources: list[Registration]
    exports: dict[str, Any] = field(default_factory=dict)
    secret_exports: set[str] = field(default_factory=set)

    def of_type(self, type_: str) -> list[Registration]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> Registration:
        found = [r for r in self.of_type(type_) if name is None or r.name == name]
        assert len(found) == 1, f"expected one {type_} {name or ''}, found {[r.name for r in found]}"
        return found[0]

    def named(self, name: str) -> Registration:
        found = [r for r in self.resources if r.name == name]
        assert len(found) == 1, f"expected one resource named {name}, found {len(found)}"
        return found[0]


SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"  # how the engine marks a secret value
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
MASK = "[secret]"


def is_secret_value(value: Any) -> bool:
    """True for a value the engine received as a Pulumi secret."""
    return isinstance(value, dict) and value.get(SECRET_SIG_KEY) == SECRET_SIG


def masked(value: Any) -> Any:
    """``value`` with every secret replaced by a mask and every mapping's keys in order: what may
    be printed or written (the engine hands a resource's inputs over in no stable key order, so
    two runs of the same stack would print and write the same objects differently)."""
    if is_secret_value(value):
        return MASK
    if isinstance(value, dict):
        return {k: masked(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the engine passes every number as a float
    return value
