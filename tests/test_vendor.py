"""The console's vendored modules (gateway/static/vendor/) are the pinned
packages, as `make vendor` copied them: no silent drift, no hand edit, and
their gzip copies (served in their place) hold the same text."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from typing import Any

from .workerkit import REPO

VENDOR = REPO / "gateway" / "static" / "vendor"
# Each file's own banner, naming its package and version.
BANNERS = {
    "markdown-it.js": r"/\*! markdown-it (\S+) ",
    "purify.js": r"/\*! @license DOMPurify (\S+) ",
}


def _json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VENDOR / name).read_text())
    return data


def test_the_vendored_files_are_the_pinned_versions_unchanged() -> None:
    pins = _json("package.json")["dependencies"]
    locked = _json("package-lock.json")["packages"]
    manifest = _json("vendor.json")
    assert sorted(manifest) == sorted(BANNERS)
    assert sorted(m["package"] for m in manifest.values()) == sorted(pins)
    for file, m in manifest.items():
        pkg, version = m["package"], m["version"]
        assert re.fullmatch(r"\d+\.\d+\.\d+", pins[pkg]), f"{pkg}: pin an exact version"
        assert version == pins[pkg] == locked[f"node_modules/{pkg}"]["version"], pkg
        text = (VENDOR / file).read_text()
        banner = re.match(BANNERS[file], text)
        assert banner and banner.group(1) == version, f"{file}: {text[:80]!r}"
        assert hashlib.sha256(text.encode()).hexdigest() == m["sha256"], f"{file} was edited"
        assert "sourceMappingURL" not in text[-200:], f"{file}: its map is not vendored"
        # What the gateway sends a browser that accepts gzip: the same file.
        assert gzip.decompress((VENDOR / f"{file}.gz").read_bytes()).decode() == text, file
    assert _json("package-lock.json")["packages"][""]["dependencies"] == pins
