"""The shape of the tree, read from its source (no import, no server): the
gateway's modules import one another without a cycle, and no module of the
product uses another module's private names.

Private means a leading underscore (not a dunder). A module's private names
are its own: `from m import _x`, `m._x`, a private module (`_aio.py`)
imported from outside its package, a subclass touching the private state of
a base class written in another module, and `obj._x` where `_x` is private
to another module of the tree all fail. A library's private names (aiohttp's,
asyncpg's) are not this test's business: a name the tree does not define is
never counted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from .workerkit import REPO

_PRODUCT = ("broker", "workers", "gateway", "runlog")

# (module, private name) -> why it is used from outside its module. Empty:
# every use found so far had a public way to say the same thing.
_ALLOWED: dict[tuple[str, str], str] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


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


def test_no_package_of_the_product_has_an_import_cycle() -> None:
    """The same within workers/, runlog/ and broker/ (found: workers.api
    imported durable's Journal for a type while durable imports the API, and
    runlog.group and runlog.up took `install_stop_signals` from the cli that
    starts them)."""
    mods = _modules()
    graph = {
        name: {t for t, _, _ in _imports(m, mods) if t.split(".")[0] == top and t != name}
        for name, m in mods.items()
        if (top := name.split(".")[0]) != "gateway"
    }
    assert _cycles(graph) == []


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


# -- private names


def _defined(node: ast.AST) -> set[str]:
    """The private names `node` defines: functions, classes, assignments and
    attributes it stores (`self._x = ...`)."""
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            names.add(n.attr)
    return {x for x in names if _private(x)}


class _Index:
    def __init__(self, mods: dict[str, _Module]) -> None:
        self.mods = mods
        self.defined = {name: _defined(m.tree) for name, m in mods.items()}
        self.owners: dict[str, set[str]] = {}
        for name, names in self.defined.items():
            for x in names:
                self.owners.setdefault(x, set()).add(name)
        # Per module: local name -> (module, class or None) it stands for.
        self.bound: dict[str, dict[str, tuple[str, str | None]]] = {}
        for name, m in mods.items():
            b: dict[str, tuple[str, str | None]] = {}
            for node in ast.walk(m.tree):
                if isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name in mods and a.asname:
                            b[a.asname] = (a.name, None)
                elif isinstance(node, ast.ImportFrom):
                    base = m.resolve(node)
                    for a in node.names:
                        local = a.asname or a.name
                        if f"{base}.{a.name}" in mods:
                            b[local] = (f"{base}.{a.name}", None)
                        elif base in mods:
                            b[local] = (base, a.name)
            for node in m.tree.body:
                if isinstance(node, ast.ClassDef):
                    b[node.name] = (name, node.name)
            self.bound[name] = b

    def cls(self, module: str, name: str) -> ast.ClassDef | None:
        for node in self.mods[module].tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None

    def ancestors(self, module: str, node: ast.ClassDef) -> Iterator[tuple[str, ast.ClassDef]]:
        """The tree's classes `node` derives from, with their modules."""
        for base in node.bases:
            target: tuple[str, str | None] | None = None
            if isinstance(base, ast.Name):
                target = self.bound[module].get(base.id)
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                mod = self.bound[module].get(base.value.id)
                if mod is not None and mod[1] is None:
                    target = (mod[0], base.attr)
            if target is None or target[1] is None:
                continue
            found = self.cls(*target)  # type: ignore[arg-type]
            if found is not None and found is not node:
                yield target[0], found
                yield from self.ancestors(target[0], found)


def _uses(ix: _Index, m: _Module) -> Iterator[tuple[int, str, str, str]]:
    """(line, what, the module whose private name it is, the name) for every
    use of another module's private name in `m`."""
    seen = set()
    for target, name, line in _imports(m, ix.mods):
        if name is not None and _private(name):
            yield line, f"from {target} import {name}", target, name
        package, _, short = target.rpartition(".")
        if _private(short) and not m.name.startswith(package + ".") and target not in seen:
            seen.add(target)
            yield line, f"import of {target}, private to {package}", package, short
    own = ix.defined[m.name]
    for cls in [n for n in ast.walk(m.tree) if isinstance(n, ast.ClassDef)]:
        for base_module, base in ix.ancestors(m.name, cls):
            if base_module == m.name:
                continue
            theirs = _defined(base)
            for n in ast.walk(cls):
                if (
                    isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name)
                    and n.value.id in ("self", "cls")
                    and n.attr in theirs
                ):
                    what = f"{cls.name}: {ast.unparse(n)} of {base.name}"
                    yield n.lineno, what, base_module, n.attr
    for n in ast.walk(m.tree):
        if not isinstance(n, ast.Attribute) or not _private(n.attr):
            continue
        if isinstance(n.value, ast.Name):
            bound = ix.bound[m.name].get(n.value.id)
            if bound is not None and bound[1] is None and bound[0] != m.name:
                yield n.lineno, ast.unparse(n), bound[0], n.attr
                continue
            if n.value.id in ("self", "cls"):
                continue  # its own class's, or a library base's (above: the tree's)
        if n.attr not in own and n.attr in ix.owners:
            owner = ", ".join(sorted(ix.owners[n.attr]))
            yield n.lineno, ast.unparse(n), owner, n.attr


def test_no_module_uses_another_modules_private_names() -> None:
    ix = _Index(_modules())
    found = [
        f"{m.path.relative_to(REPO)}:{line}: {what} (private to {owner})"
        for m in ix.mods.values()
        for line, what, owner, name in _uses(ix, m)
        if (owner, name) not in _ALLOWED
    ]
    assert found == []


def test_private_uses_are_found(tmp_path: Path) -> None:
    """The scan finds each kind of use it claims to (a tree of its own)."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    files = {
        "pkg/__init__.py": "",
        "pkg/_helpers.py": "X = 1\n",
        "pkg/base.py": (
            "class _Body: ...\n"
            "class Base:\n    def __init__(self):\n        self._state = self._count = 0\n"
            "def _util(): ...\n"
        ),
        "pkg/sub/__init__.py": "",
        "pkg/sub/_priv.py": "Y = 2\n",
        "pkg/user.py": (
            "from pkg import base\n"
            "from pkg.base import _util, Base\n"
            "from pkg.sub import _priv\n"
            "from pkg.sub._priv import Y\n"
            "class Body(base._Body): ...\n"
            "class Child(Base):\n    def f(self):\n        self._state += 1\n"
            "def g(obj):\n    return obj._count\n"
        ),
        "pkg/sub/fine.py": (
            "from pkg import _helpers\n"
            "from . import _priv\n"
            "from aiohttp import web\n"
            "class S(web.Server):\n    def f(self):\n        return self._loop\n"
            "def h(r):\n    return r._payload\n"
        ),
    }
    for rel, text in files.items():
        (tmp_path / rel).write_text(text)
    mods = {}
    for rel in files:
        parts = rel.removesuffix(".py").split("/")
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = _Module(".".join(parts), tmp_path / rel)
    ix = _Index(mods)
    assert sorted(what for _, what, _, _ in _uses(ix, mods["pkg.user"])) == [
        "Child: self._state of Base",
        "base._Body",
        "from pkg.base import _util",
        "import of pkg.sub._priv, private to pkg.sub",
        "obj._count",
    ]
    assert list(_uses(ix, mods["pkg.sub.fine"])) == []
