"""The package's import graph: no cycle between its parts, evaluation independent of training, benchmarks only lazily.

Every ``import`` / ``from ... import`` under ``hybrid_attention/`` counts, at module level or inside a function,
absolute or relative. A part is a subpackage (``training``, ``evaluation``, ``data``, ...) or a top-level module
(``cli``, ``plots``, ...; ``__init__`` is the part ``hybrid_attention``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hybrid_attention"

# the one import of the repository's benchmarks/ folder: the ``bench`` command, inside its function
BENCHMARK_IMPORTS = {("hybrid_attention/cli.py", "_cmd_bench")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _part(module: str) -> str | None:
    """The part of the package that ``module`` belongs to (None: outside the package)."""
    parts = module.split(".")
    if parts[0] != "hybrid_attention":
        return None
    if len(parts) == 1:
        return "hybrid_attention"
    return parts[1]


def _imports(path: Path) -> list[tuple[str, str | None]]:
    """(imported module, enclosing function or None) of every import statement in ``path``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # ``from hybrid_attention import plots``: the imported names may be modules themselves
                found.extend((f"{base}.{alias.name}", function) for alias in child.names)
            visit(child, function)

    visit(tree, None)
    return found


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _edges() -> dict[str, set[str]]:
    """part -> the other parts it imports."""
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    graph: dict[str, set[str]] = {}
    for path in _sources():
        here = _part(_module_name(path))
        graph.setdefault(here, set())
        for module, _ in _imports(path):
            there = _part(module)
            if there is None or there == here:
                continue
            if there not in parts and not (PACKAGE / f"{there}.py").exists():
                there = "hybrid_attention"  # a name defined in the package's __init__
            if there != here:
                graph[here].add(there)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_parse_sees_relative_and_function_level_imports():
    imports = _imports(PACKAGE / "cli.py")
    assert ("benchmarks.run_target", "_cmd_bench") in imports
    graph = _edges()
    assert "models" in graph["training"]  # ``from hybrid_attention.models import ...`` at module level
    assert "layers" in graph["models"]
    assert "training" in graph["cli"]  # imported inside the command functions


def test_no_cycle_between_parts():
    cycle = _cycle(_edges())
    assert cycle is None, "import cycle between parts of hybrid_attention: " + " -> ".join(cycle)


def test_evaluation_imports_nothing_from_training():
    found = [(str(path.relative_to(PACKAGE.parent)), module) for path in _sources()
             if _part(_module_name(path)) == "evaluation"
             for module, _ in _imports(path) if _part(module) == "training"]
    assert found == []


def test_benchmarks_are_imported_only_by_the_bench_command():
    found = {(str(path.relative_to(PACKAGE.parent)), function) for path in _sources()
             for module, function in _imports(path) if module.split(".")[0] == "benchmarks"}
    assert found == BENCHMARK_IMPORTS
