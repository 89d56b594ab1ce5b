"""Every test is exactly one of unit, integration and browser (conftest.py
assigns them by the fixtures a test uses), so `make test-fast` (unit, not
slow) runs no server and `make test` runs everything."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import BROWSER_FIXTURES, COLLECTED, KINDS, SERVER_FIXTURES, SERVER_MODULES, SLOW

ROOT = Path(__file__).resolve().parent.parent
# Selects a test with no kind or with two: none may match.
_MISMARKED = (
    "not (unit or integration or browser)"
    " or (unit and integration) or (unit and browser) or (integration and browser)"
)


def _kinds(item: pytest.Item) -> list[str]:
    return [k for k in KINDS if item.get_closest_marker(k) is not None]


def test_each_collected_test_has_one_kind_and_no_unit_test_uses_a_server(
    request: pytest.FixtureRequest,
) -> None:
    """Over what this session collected, deselected tests included (the whole
    suite under `make test` and `make test-fast`). A test may say
    `integration` itself (one that starts a server in its body, where no
    fixture shows it); never `unit` over a server fixture."""
    items = request.config.stash[COLLECTED]
    assert request.node in items
    wrong = []
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        kinds = _kinds(item)
        if used & BROWSER_FIXTURES:
            ok = kinds == ["browser"]
        elif used & SERVER_FIXTURES or item.path.name in SERVER_MODULES:
            ok = kinds == ["integration"]
        else:
            ok = len(kinds) == 1
        if not ok:
            wrong.append(f"{item.nodeid}: {kinds}, uses {sorted(used)}")
    assert not wrong, wrong[:20]


def test_no_test_of_the_suite_has_no_kind_or_two() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         "-m", _MISMARKED, "tests"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    last = done.stdout.strip().splitlines()[-1]
    # Exit 5: every test collected was deselected, none selected.
    assert done.returncode == 5, done.stdout[-3000:] + done.stderr[-3000:]
    assert last.startswith("no tests collected (") and "deselected" in last, last
    collected = int(last.removeprefix("no tests collected (").split()[0])
    assert collected > 1000, last


def test_each_slow_entry_names_a_module_or_a_test_of_it() -> None:
    tests = Path(__file__).resolve().parent
    stale = []
    for entry in sorted(SLOW):
        module, _, name = entry.partition("::")
        path = tests / module
        source = path.read_text() if path.is_file() else ""
        if not source or (name and not re.search(rf"^(async )?def {name}\(", source, re.M)):
            stale.append(entry)
    assert not stale, f"conftest.SLOW names no test: {stale}"
