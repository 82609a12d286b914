"""The package's import order: no module imports one that imports it back (counting imports
inside functions and those made only for type checking), and ``import torch_ntm`` loads what the
module API needs, no engine: those load when a model first runs on them."""

import ast
import subprocess
import sys
from pathlib import Path

import torch_ntm

ROOT = Path(torch_ntm.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's explicit imports of the package's modules, wherever they stand in it."""
    edges = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
                for alias in node.names:  # `from torch_ntm import engines` names a module
                    sub = f"{node.module}.{alias.name}"
                    edges[name].add(sub if sub in modules else node.module)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports, if there is one (depth-first search for a back edge)."""
    state, path = {}, []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    assert _cycle(_imports(_modules())) is None


def test_the_check_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_import_loads_no_engine_nor_the_tools():
    code = "import sys, torch_ntm; print(' '.join(m for m in sys.modules if 'torch_ntm' in m))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    assert {"torch_ntm.model", "torch_ntm.mann", "torch_ntm.dnc"} <= loaded
    for module in ("engines.ntm", "engines.mann", "engines.dnc", "engines.graphs",
                   "engines.library", "train", "cli", "checkpoint", "config", "tasks"):
        assert f"torch_ntm.{module}" not in loaded, module
