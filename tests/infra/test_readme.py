"""The README's configuration reference against the settings dataclasses: every key a stack
file may hold is documented, so a user never has to read the code to configure a stack."""

from __future__ import annotations

import re
from pathlib import Path

from components.planning.hardware import PROFILES
from components.settings import SCALAR_KEYS, SECRET_KEYS, SECTIONS
from components.settings_parser import section_keys
from components.stack import Export

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def documented(section: str, key: str) -> bool:
    """A reference row starts with `section.key`, or names the key after `section.` in one row."""
    return any(
        line.startswith("|") and f"`{section}." in line.split("|")[1] and f"{key}`" in line.split("|")[1]
        for line in README.splitlines()
    )


def test_every_settings_key_is_in_the_configuration_reference():
    missing = [
        f"{section}.{key}"
        for section, cls in SECTIONS.items()
        for key in section_keys(cls)
        if not documented(section, key)
    ]
    missing += [key for key in (*SCALAR_KEYS, *SECRET_KEYS) if f"| `{key}` |" not in README]
    assert not missing, f"README configuration reference lacks {missing}"


def test_the_profile_key_lists_every_row_and_no_other():
    """The README names the profiles (with their instance types) in the configuration reference
    only, and points at the rows for the rest: the sources live in docs/design.md."""
    (row,) = [line for line in README.splitlines() if line.startswith("| `profile` |")]
    named = dict(re.findall(r"`([\w-]+)` \(([\w.]+)\)", row))
    assert named == {name: p.instance_type for name, p in PROFILES.items()}
    assert "components/planning/hardware.py" in row


def test_readme_names_the_two_commands():
    assert "make demo" in README and "make test" in README


def test_every_output_the_readme_reads_is_one_the_stack_exports():
    """The README's `pulumi stack output <name>` lines name the stack's exports (components/stack.py's
    ``Export``): a renamed output fails here instead of in a user's shell."""
    read = set(re.findall(r"pulumi stack output (\w+)", README))
    assert read and read <= {e.value for e in Export}, read - {e.value for e in Export}
