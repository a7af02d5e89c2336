"""The import graph of the project, read from the sources (ast): no module imports itself back
through others, no module imports a layer above its own, no function hides an import of a
project module (the graph a reader sees at the top of each file is the whole graph), and the
planning layer runs without Pulumi and torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("components", "offline", "training", "tests")
"""The project's top-level packages."""
PRODUCT = ("components", "offline", "training")
"""Packages whose functions may not import a project module (the tests' workers may: a spawned
process imports what it runs)."""
PLANNING = "components.planning"
LAYERS: tuple[tuple[str, ...], ...] = (
    ("training",),
    (PLANNING,),
    ("components.versions", "components.settings", "components.settings_problems", "components.settings_rules"),
    ("components",),
    ("offline",),
    ("tests",),
)
"""The layers from the bottom up, each named by its module prefixes: a module imports its own
layer and those below, never one above. The training package stands alone (the image is built
from training/ only); the planning layer reads its shapes and GPU rows; the settings (the typed
stack file, its pins and its rules) read the planning layer; the components build on the
settings; the offline wing runs the program, and the tests everything."""
BLOCKED = ("pulumi", "pulumi_aws", "pulumi_eks", "pulumi_kubernetes", "torch")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imported(node: ast.AST, known: dict[str, Path]) -> list[str]:
    """The project modules an import statement names (``from a import b`` names ``a.b`` when
    that is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                 for a in node.names]
    else:
        return []
    return [n for n in names if n.split(".")[0] in PACKAGES]


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the project modules it imports at its top level; and every import of a project
    module inside a function of a product package, as ``file:line``."""
    known = modules()
    edges: dict[str, set[str]] = {}
    hidden = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        edges[name] = {m for node in tree.body for m in imported(node, known) if m in known and m != name}
        if name.split(".")[0] in PRODUCT:
            for func in ast.walk(tree):
                if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    hidden += [f"{path.relative_to(ROOT)}:{n.lineno} imports {', '.join(imported(n, known))}"
                               for n in ast.walk(func) if imported(n, known)]
    return edges, hidden


def layer(module: str) -> int:
    """The index in LAYERS of the layer whose prefix names ``module`` most closely."""
    found = [(len(prefix), i) for i, prefixes in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    return max(found)[1]


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Every import of a module in a layer above the importer's, as ``importer -> imported``."""
    return sorted(f"{m} -> {n}" for m, targets in edges.items() for n in targets if layer(n) > layer(m))


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk meets, each as the modules around it."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_the_project_imports_have_no_cycle():
    assert cycles(graph()[0]) == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward(graph()[0]) == []


def test_the_layers_see_an_upward_import():
    """The rule itself: planning reading the settings, training reading the planning layer, the
    settings reading a component, or a component reading the offline wing is refused; the
    other way round is not."""
    assert upward({"components.planning.forecast": {"components.settings"},
                   "training.metrics": {"components.planning.hardware"},
                   "components.settings_rules.cluster": {"components.network"},
                   "components.stack": {"offline.mocks"}}) == [
        "components.planning.forecast -> components.settings",
        "components.settings_rules.cluster -> components.network",
        "components.stack -> offline.mocks",
        "training.metrics -> components.planning.hardware"]
    assert upward({"components.settings": {"components.planning.hardware", "training.config"},
                   "offline.plan": {"components.stack"}, "tests.harness": {"offline.mocks"}}) == []


def test_no_function_imports_a_project_module():
    assert graph()[1] == []


def test_the_checks_see_a_cycle_and_a_hidden_import():
    """The walk itself: a two-module circle is found, and so is an import inside a function."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"]]
    func = ast.parse("def f():\n    from components import versions\n").body[0]
    assert [imported(n, modules()) for n in ast.walk(func) if isinstance(n, ast.ImportFrom)] == [
        ["components.versions"]]


def test_the_planning_layer_imports_neither_pulumi_nor_torch():
    """Every module of components/planning/ imported in a fresh interpreter in which importing
    Pulumi or torch raises."""
    planning = sorted(m for m in modules() if m.startswith(PLANNING))
    script = (
        "import importlib, importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {BLOCKED!r}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for m in {planning!r}:\n"
        "    importlib.import_module(m)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BLOCKED!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    assert len(planning) >= 5  # the package and its four modules
