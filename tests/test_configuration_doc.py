"""docs/configuration.md is the settings table, current with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from broker import settings

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_configuration_page_is_generated_from_the_settings() -> None:
    expected = settings.markdown()
    assert DOC.read_text() == expected, (
        "docs/configuration.md is stale: run `runlog settings --markdown > docs/configuration.md`"
    )
    # The command the page names prints exactly that.
    out = subprocess.run(
        [sys.executable, "-m", "runlog.cli", "settings", "--markdown"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert out.stdout == expected
    for f in settings.Settings.table():
        assert f"`{f[0]}`" in expected
