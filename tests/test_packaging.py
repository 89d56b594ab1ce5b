"""What `pip install runlog` (and so the container image) gets: every module
of the tree, the migrations and the console (its vendored modules too), in
the wheel; and nothing that is not the product (the benchmarks and their
experiments stay in the tree)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from .workerkit import REPO

_TOP = ("broker", "workers", "gateway", "migrations", "runlog")


def test_the_wheel_holds_every_module_of_the_tree(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("runlog-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = {
        str(p.relative_to(REPO))
        for top in _TOP
        for p in (REPO / top).rglob("*")
        if p.suffix in (".py", ".sql") and "__pycache__" not in p.parts
    }
    assert sorted(tree - names) == []
    assert sorted(n for n in names if n.startswith(("bench/", "tests/"))) == []
    assert {"gateway/static/index.html", "migrations/0001_initial.sql"} <= names
    # The console, every file of it: `make run` and the image need no npm.
    static = {
        str(p.relative_to(REPO)) for p in (REPO / "gateway" / "static").rglob("*") if p.is_file()
    }
    assert sorted(static - names) == []
    assert {"gateway/static/vendor/markdown-it.js", "gateway/static/vendor/purify.js"} <= names
