"""The import direction of DESIGN.md: cli -> profiles -> engine, and inside the engine
runtime -> models -> backends, with no arrow back and no cycle between engine modules. Two doors
besides: `cli/` reaches the engine only through its front door (`infer.engine`, engine/__init__.py),
and only `engine/backends/` itself imports a cpu backend module (cpu.py, cpu_kernels/, cpu_threads.py,
...): everything else asks the backend interface.

Every import counts, at module level, under TYPE_CHECKING or inside a function: a lazy import that
points the wrong way is the same design problem as an eager one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"cli": "infer.cli", "engine": "infer.engine", "profiles": "infer.profiles"}
"""Source folders and the import package each maps to (pyproject.toml's package-dir)."""

FORBIDDEN: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # (importer prefix, forbidden import prefixes, allowed exceptions)
    ("infer.engine", ("infer.profiles", "infer.cli"), ()),
    ("infer.profiles", ("infer.cli",), ()),
    ("infer.engine.backends", ("infer",), ("infer.engine.backends",)),
    ("infer.engine.models", ("infer.engine.runtime",), ()),
    ("infer.engine.loader", ("infer.engine.runtime",), ()),
    ("infer.engine.sampling", ("infer.engine.runtime", "infer.engine.models", "infer.engine.backends"), ()),
    ("infer.engine.text", ("infer.engine.runtime", "infer.engine.models", "infer.engine.sampling"), ()),
    (
        "infer.engine.grammar",
        ("infer.engine.runtime", "infer.engine.models", "infer.engine.backends", "infer.engine.sampling"),
        (),
    ),
    ("infer.engine.speculative", ("infer.engine.runtime",), ()),
    # worker processes run handler files by path, without `infer`: the mechanism depends on nothing
    ("infer.engine.workers", ("infer",), ("infer.engine.workers",)),
)
"""Who may not import what."""

FRONT_DOORS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    # (importer prefix, the only modules it may import exactly, the only packages it may import within)
    ("infer.cli", ("infer.engine",), ("infer.cli", "infer.profiles")),
)
"""Who may import only what."""

CPU_BACKEND_PREFIX = "infer.engine.backends.cpu"
"""Modules of the cpu backend: infer.engine.backends.cpu, .cpu_kernels.*, .cpu_threads, .cpu_setup, ..."""


def is_cpu_backend_module(module: str) -> bool:
    """Whether `module` belongs to the cpu backend (its name under backends starts with `cpu`)."""
    return module.startswith(CPU_BACKEND_PREFIX)


def module_name(path: Path) -> str:
    """The dotted module name of a source file under one of PACKAGE_DIRS."""
    relative = path.relative_to(ROOT)
    parts = [PACKAGE_DIRS[relative.parts[0]], *relative.parts[1:]]
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {
        module_name(path): path
        for folder in PACKAGE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The `infer` modules that module `name` imports anywhere in its body.

    `from pkg import sub` counts as importing `pkg.sub` when that is a module, else `pkg`.
    """
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
    return {module for module in found if module == "infer" or module.startswith("infer.")}


def import_graph() -> dict[str, set[str]]:
    """module -> the infer modules it imports."""
    modules = source_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def direction_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """'importer -> imported' for every import that FORBIDDEN rules out."""
    found: list[str] = []
    for importer, imported in sorted(graph.items()):
        for prefix, forbidden, allowed in FORBIDDEN:
            if not _within(importer, prefix):
                continue
            for target in sorted(imported):
                if any(_within(target, f) for f in forbidden) and not any(
                    _within(target, a) for a in allowed
                ):
                    found.append(f"{importer} -> {target}")
    return sorted(set(found))


def front_door_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """'importer -> imported' for every import that FRONT_DOORS or the cpu backend's privacy rules out."""
    found: list[str] = []
    for importer, imported in sorted(graph.items()):
        for prefix, exact, within in FRONT_DOORS:
            if _within(importer, prefix):
                found += [
                    f"{importer} -> {target}"
                    for target in imported
                    if target not in exact and not any(_within(target, w) for w in within)
                ]
        if not _within(importer, "infer.engine.backends"):
            found += [f"{importer} -> {target}" for target in imported if is_cpu_backend_module(target)]
    return sorted(set(found))


def cycles(graph: Mapping[str, set[str]], prefix: str) -> list[list[str]]:
    """Strongly connected components of more than one module (or a self-import) under `prefix`."""
    nodes = sorted(n for n in graph if _within(n, prefix))
    edges = {n: sorted(t for t in graph[n] if t in graph and _within(t, prefix)) for n in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph is small, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in edges[node]:
                found.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return found


def test_every_source_module_is_seen() -> None:
    graph = import_graph()
    assert "infer.engine.runtime.engine" in graph
    assert "infer.engine" in graph["infer.cli.runtime"]
    assert "infer.profiles.settings" in graph["infer.cli.options"]


def test_imports_point_one_way() -> None:
    assert direction_violations(import_graph()) == []


def test_cli_enters_the_engine_by_its_front_door_and_only_backends_see_the_cpu_backend() -> None:
    assert front_door_violations(import_graph()) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"infer.cli.x": {"infer.engine", "infer.profiles.settings", "infer.cli.y"}}, []),
        ({"infer.cli.x": {"infer.engine.runtime.engine"}}, ["infer.cli.x -> infer.engine.runtime.engine"]),
        ({"infer.cli.x": {"infer.engine.backends"}}, ["infer.cli.x -> infer.engine.backends"]),
        (
            {"infer.profiles.y": {"infer.engine.backends.cpu"}},
            ["infer.profiles.y -> infer.engine.backends.cpu"],
        ),
        (
            {"infer.engine.runtime.engine": {"infer.engine.backends.cpu_threads"}},
            ["infer.engine.runtime.engine -> infer.engine.backends.cpu_threads"],
        ),
        (
            {"infer.engine.models.llama": {"infer.engine.backends.cpu_kernels.compile_watch"}},
            ["infer.engine.models.llama -> infer.engine.backends.cpu_kernels.compile_watch"],
        ),
        ({"infer.engine.backends.cpu": {"infer.engine.backends.cpu_setup"}}, []),
        ({"infer.profiles.schema": {"infer.engine.backends"}}, []),
    ],
)
def test_the_front_door_check_catches_a_side_door(graph: dict[str, set[str]], expected: list[str]) -> None:
    assert front_door_violations(graph) == expected


def test_no_import_cycle_between_engine_modules() -> None:
    assert cycles(import_graph(), "infer.engine") == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"infer.engine.x": {"infer.profiles.settings"}}, ["infer.engine.x -> infer.profiles.settings"]),
        ({"infer.profiles.y": {"infer.cli.options"}}, ["infer.profiles.y -> infer.cli.options"]),
        (
            {"infer.engine.backends.cpu": {"infer.engine.runtime.scheduler", "infer.engine.backends.base"}},
            ["infer.engine.backends.cpu -> infer.engine.runtime.scheduler"],
        ),
        (
            {"infer.engine.models.llama": {"infer.engine.runtime.kv_cache"}},
            ["infer.engine.models.llama -> infer.engine.runtime.kv_cache"],
        ),
        ({"infer.cli.x": {"infer.engine.runtime.engine"}}, []),
    ],
)
def test_the_direction_check_catches_a_wrong_arrow(graph: dict[str, set[str]], expected: list[str]) -> None:
    assert direction_violations(graph) == expected


def test_the_cycle_check_catches_a_cycle() -> None:
    graph = {
        "infer.engine.a": {"infer.engine.b"},
        "infer.engine.b": {"infer.engine.a"},
        "infer.engine.c": {"infer.engine.a"},
        "infer.cli.d": {"infer.cli.d"},
    }
    assert cycles(graph, "infer.engine") == [["infer.engine.a", "infer.engine.b"]]
