"""No product function is 50 lines or more: read from the sources (ast) of components/,
training/ and offline/. A function that long does several things; it is split where a reader
would (the house style: the training step fits on one screen, setup is `_build_*` steps, a
component's constructor reads as a list of steps). A function counts from its `def` line to its
last line, the functions nested in it included."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("components", "training", "offline")
LIMIT = 50
"""The first length that is too long, in lines."""


def long_functions(root: Path, packages: tuple[str, ...] = PRODUCT) -> dict[tuple[str, str], int]:
    """(file relative to ``root``, function name) -> lines, for every function of ``LIMIT`` lines
    or more in ``packages``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines >= LIMIT:
                        found[(path.relative_to(root).as_posix(), node.name)] = lines
    return found


def test_no_product_function_is_50_lines_or_more():
    long = long_functions(ROOT)
    assert not long, "split these where a reader would: " + ", ".join(
        f"{file} {name} ({lines} lines)" for (file, name), lines in sorted(long.items()))


def _function(name: str, lines: int, indent: str = "", nested: bool = False) -> str:
    """A function of ``lines`` lines (``nested``: the first two of its body define another)."""
    head = [f"{indent}def {name}():"] + ([f"{indent}    def inner():", f"{indent}        return 1"] if nested else [])
    return "\n".join(head + [f"{indent}    x{i} = {i}" for i in range(lines - len(head))]) + "\n\n\n"


def test_the_walk_sees_long_functions_methods_and_what_is_nested_in_them(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        _function("outer", LIMIT, nested=True) + "class Shape:\n" + _function("method", LIMIT, "    ")
        + _function("short", LIMIT - 1))
    assert long_functions(tmp_path, ("pkg",)) == {("pkg/mod.py", "outer"): LIMIT,
                                                  ("pkg/mod.py", "method"): LIMIT}
