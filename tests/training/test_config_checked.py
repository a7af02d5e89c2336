"""Where a job config is checked: once, by ``from_fields`` (and ``parse_args`` through it), not
by its constructor; and the training package makes a config from input nowhere else. Checked
against the package's own sources (ast) and its command line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from training import config as C

TRAINING = Path(C.__file__).resolve().parent
CONFIG_CLASSES = {"JobConfig", *(section.__name__ for section in C.SECTIONS.values())}


def test_the_constructor_checks_nothing_and_from_fields_names_the_flag():
    unchecked = C.JobConfig(data=C.DataConfig(seq_len=1))  # what from_fields must not let through
    assert [p.key for p in unchecked.problems()] == ["seq_len"]
    with pytest.raises(C.ConfigError, match="--seq-len: must be at least 8"):
        C.from_fields({"seq_len": 1})


def test_parse_args_exits_as_a_usage_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exited:
        C.parse_args(["--seq-len", "1"])
    assert exited.value.code == 2 and "--seq-len: must be at least 8" in capsys.readouterr().err


class _Constructions(ast.NodeVisitor):
    """Calls of a config class's constructor, each with the function it stands in ("" at module level)."""

    def __init__(self) -> None:
        self.functions: list[str] = []
        self.found: list[tuple[int, str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        if name in CONFIG_CLASSES:
            self.found.append((node.lineno, self.functions[-1] if self.functions else ""))
        self.generic_visit(node)


def config_constructions(root: Path) -> list[str]:
    """``file:line function`` of every call of a config class's constructor under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        visitor = _Constructions()
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        found += [f"{path.relative_to(root).as_posix()}:{line} {function}" for line, function in visitor.found]
    return found


def test_only_from_fields_makes_a_config_in_the_training_package():
    outside = [c for c in config_constructions(TRAINING) if not c.startswith("config.py:") or
               not c.endswith(" from_fields")]
    assert not outside, f"a config made from unchecked input: route it through from_fields: {outside}"
    assert config_constructions(TRAINING), "the walk finds from_fields' own constructions"
