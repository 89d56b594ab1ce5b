"""The shape of the tree, read from its source (no import, no server): the
gateway's modules import one another without a cycle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from .workerkit import REPO

_PRODUCT = ("broker", "workers", "gateway", "runlog")


class _Module:
    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.tree = ast.parse(path.read_text(), str(path))
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        return f"{base}.{node.module}" if node.module else base


def _modules() -> dict[str, _Module]:
    found = {}
    for top in _PRODUCT:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = _Module(".".join(parts), path)
    return found


def _imports(m: _Module, mods: dict[str, _Module]) -> Iterator[tuple[str, str | None, int]]:
    """(module imported, the name taken from it or None, line) for every
    import of the tree's modules, wherever it stands (in a function, under
    `if TYPE_CHECKING:`)."""
    for node in ast.walk(m.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    yield a.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = m.resolve(node)
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    yield f"{base}.{a.name}", None, node.lineno
                elif base in mods:
                    yield base, a.name, node.lineno


# -- import cycles


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_gateway_modules_import_each_other_without_a_cycle() -> None:
    """Imports under `if TYPE_CHECKING:` count: a module that needs the type
    of what owns it (the Gateway context, say) is tied to it all the same,
    and only a Protocol of what it uses unties them."""
    mods = _modules()
    graph = {
        name: {t for t, _, _ in _imports(m, mods) if t.startswith("gateway") and t != name}
        for name, m in mods.items()
        if name.startswith("gateway")
    }
    assert _cycles(graph) == []
    # It sees the imports it must: under TYPE_CHECKING, and relative ones.
    assert "gateway.hub" in graph["gateway.connection"]
    assert "gateway.sse" in graph["gateway.compat.serve"]


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
