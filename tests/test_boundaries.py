"""The store owns all SQL (issue 23, item 2), read from the source (no import,
no server): no module of the workers, the gateway or the CLI imports asyncpg
or names it, none reaches past the Store to its pool, and no public
function of the broker hands out the driver's types (a page row is a
`PageRow`, the rest are the broker's own types).
"""

from __future__ import annotations

import ast
from pathlib import Path

from .workerkit import REPO

_OUTSIDE = ("workers", "gateway", "runlog")


def _sources(tops: tuple[str, ...]) -> list[Path]:
    return [p for top in tops for p in sorted((REPO / top).rglob("*.py"))]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name


def _asyncpg_uses(path: Path) -> list[str]:
    """Where `path` imports asyncpg, names it, or spells `asyncpg.` in a
    string (a quoted annotation): "file:line what"."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        what = None
        if isinstance(node, ast.Import):
            if any(a.name.split(".")[0] == "asyncpg" for a in node.names):
                what = "import asyncpg"
        elif isinstance(node, ast.ImportFrom):
            if not node.level and (node.module or "").split(".")[0] == "asyncpg":
                what = f"from {node.module} import"
        elif isinstance(node, ast.Name) and node.id == "asyncpg":
            what = "asyncpg"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "asyncpg." in node.value:
                what = "'asyncpg.' in a string"
        if what is not None:
            line = getattr(node, "lineno", 0)
            found.append((line, f"{_rel(path)}:{line} {what}"))
    return [u for _, u in sorted(found)]


def _pool_uses(path: Path) -> list[str]:
    """Where `path` reaches a store's pool (`store.pool`, `x.store.pool`)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "pool":
            v = node.value
            if (isinstance(v, ast.Name) and v.id == "store") or (
                isinstance(v, ast.Attribute) and v.attr == "store"
            ):
                found.append((node.lineno, f"{_rel(path)}:{node.lineno} {ast.unparse(node)}"))
    return [u for _, u in sorted(found)]


def _driver_returns(path: Path) -> list[str]:
    """Public functions and methods of `path` whose return annotation names
    asyncpg. Not a Protocol's members: they declare what the broker's own
    modules use of the Store they are given (retry.Database), not a call."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    protocols = [c for c in classes if "Protocol" in {ast.unparse(b) for b in c.bases}]
    scopes: list[ast.AST] = [tree, *(c for c in classes if c not in protocols)]
    for scope in scopes:
        for fn in ast.iter_child_nodes(scope):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.returns is None:
                continue
            if fn.name.startswith("_"):
                continue
            if "asyncpg" in ast.unparse(fn.returns):
                found.append(f"{_rel(path)}:{fn.lineno} {fn.name} -> {ast.unparse(fn.returns)}")
    return found


def test_nothing_outside_the_broker_uses_asyncpg() -> None:
    found = [u for p in _sources(_OUTSIDE) for u in _asyncpg_uses(p)]
    assert found == []


def test_nothing_outside_the_broker_reaches_the_pool() -> None:
    assert [u for p in _sources(_OUTSIDE) for u in _pool_uses(p)] == []


def test_no_public_broker_function_returns_a_driver_type() -> None:
    assert [u for p in _sources(("broker",)) for u in _driver_returns(p)] == []


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from __future__ import annotations\n"
        "import asyncpg.pool\n"
        "from asyncpg import Record\n"
        "x: 'asyncpg.Pool'\n"
        "class Store:\n"
        "    async def row(self) -> asyncpg.Record: ...\n"
        "    async def _row(self) -> asyncpg.Record: ...\n"
        "async def rows(ctx) -> list[int]:\n"
        "    return await ctx.store.pool.fetch('SELECT 1')\n"
        "async def one(store) -> int:\n"
        "    return await store.pool.fetchval('SELECT 1')\n"
        "class Database(Protocol):\n"
        "    @property\n"
        "    def pool(self) -> asyncpg.Pool: ...\n"
    )
    assert _asyncpg_uses(src) == [
        "m.py:2 import asyncpg",
        "m.py:3 from asyncpg import",
        "m.py:4 'asyncpg.' in a string",
        "m.py:6 asyncpg",
        "m.py:7 asyncpg",
        "m.py:14 asyncpg",
    ]
    assert _pool_uses(src) == ["m.py:9 ctx.store.pool", "m.py:11 store.pool"]
    assert _driver_returns(src) == ["m.py:6 row -> asyncpg.Record"]
