"""One error registry (broker/codes.py): every code a client, an operator or a
run's reader can get is defined there once, every answer path takes its
status, `retryable` flag and close code from it, and docs/protocol.md's
error tables are rendered from it (issue 23, item 3)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry

from broker import codes, errors
from gateway import disconnect, error_answer
from workers import errors as worker_errors
from workers.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "protocol.md"
PACKAGES = ("broker", "gateway", "workers", "runlog")


def _import_all() -> None:
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        for m in pkgutil.walk_packages(pkg.__path__, name + "."):
            if m.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(m.name)
            except ImportError:  # an optional framework not installed here
                continue


def _classes() -> list[type[errors.RunlogError]]:
    _import_all()
    out: list[type[errors.RunlogError]] = []
    todo = [errors.RunlogError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out


def _doc_row(code: str) -> list[str]:
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and f"`{code}`" in cells[0].split(", "):
            return cells
    raise AssertionError(f"docs/protocol.md has no row for {code}")


def _source(*folders: str) -> dict[Path, str]:
    return {p: p.read_text() for f in folders for p in sorted((ROOT / f).rglob("*.py"))}


def test_each_code_is_defined_by_one_class() -> None:
    """`invalid_request` was two classes (gateway/rest.py and the LangGraph
    compat's UnsupportedStreamMode): one code, one class, the others derive."""
    by_code: dict[str, list[str]] = {}
    for cls in _classes():
        if "code" in vars(cls):
            by_code.setdefault(cls.code, []).append(f"{cls.__module__}.{cls.__qualname__}")
    by_code.get("internal", []).remove("broker.errors.InternalError")
    twice = {c: names for c, names in by_code.items() if len(names) > 1}
    assert twice == {}


def test_every_error_class_takes_its_status_and_flag_from_the_registry() -> None:
    for cls in _classes():
        entry = codes.CODES.get(cls.code)
        assert entry is not None, f"{cls.__qualname__}: {cls.code} is not in broker/codes.py"
        assert cls.retryable is entry.retryable, cls
        if entry.http is not None:
            assert cls.http_status == entry.http, cls
        if issubclass(cls, errors.ClientError):
            assert entry.fault == "client", cls


def test_internal_is_retryable_on_every_path() -> None:
    """broker/errors.py said false, the REST answer, aiohttp's refusal of an
    error past the middleware and docs/protocol.md said true: an unexpected
    server error is worth a retry with backoff (an idempotent read, a stream
    that resumes), so it is true everywhere."""
    assert errors.InternalError("x").to_dict()["retryable"] is True
    assert errors.RunlogError().retryable is True
    resp = error_answer.answer(make_mocked_request("GET", "/v1/x"), RuntimeError("boom"))
    assert resp.status == 500 and resp.body is not None
    body = json.loads(bytes(resp.body))  # type: ignore[arg-type]
    assert body["error"] == {"code": "internal", "message": "internal error", "retryable": True}
    assert disconnect.CODES["internal"].reconnect == "resume"
    assert worker_errors.RunFailure("internal").retryable is True
    assert _doc_row("internal")[-1].startswith("yes")


def test_run_busy_is_documented_as_the_code_answers() -> None:
    """docs/protocol.md said "later", the code says not retryable. Not
    retryable it stays: a client repeating the start until it passes turns
    the owner's `reject` policy into `enqueue`."""
    assert errors.RunBusy().retryable is False
    assert _doc_row("run_busy")[-1].startswith("no")


def test_client_gone_is_documented() -> None:
    row = _doc_row("client_gone")
    assert row[1] == "499"
    resp = error_answer.answer(make_mocked_request("GET", "/v1/x"), ConnectionResetError())
    assert resp.status == 499 and resp.body is not None
    assert json.loads(bytes(resp.body))["error"] == codes.body(  # type: ignore[arg-type]
        "client_gone", "the client went away"
    )


def test_no_answer_writes_its_own_retryable_flag() -> None:
    """Error bodies are built by RunlogError.to_dict or codes.body, never by
    hand (the hand-written ones disagreed with the classes)."""
    literal = re.compile(r"""["']retryable["']\s*:\s*(True|False)""")
    found = [f"{p.relative_to(ROOT)}:{m.group(0)}" for p, text in
             _source("broker", "gateway", "workers").items() for m in literal.finditer(text)]  # fmt: skip
    assert found == []


def test_every_close_and_disconnect_code_is_registered() -> None:
    assert set(disconnect.CODES) == set(codes.disconnect_codes())
    for name, d in disconnect.CODES.items():
        entry = codes.get(name)
        assert (d.close_code, d.reconnect) == (entry.close, entry.reconnect)
    closes = re.compile(r"""\.close\(\s*["']([a-z_]+)["']""")
    used = {m.group(1) for text in _source("gateway").values() for m in closes.finditer(text)}
    assert used and used <= set(disconnect.CODES)


def _adapter_codes() -> set[str]:
    """The code literals the worker's adapters and frameworks raise with."""
    call = re.compile(r"""(?:ModelError|AgentError|RunFailure)\(\s*["']([a-z_]+)["']""")
    table = re.compile(r"""\([A-Z]\w+, ["']([a-z_]+)["'], (?:True|False)\)""")
    found: set[str] = set()
    for text in _source("workers").values():
        found |= {m.group(1) for m in call.finditer(text)}
        found |= {m.group(1) for m in table.finditer(text)}
    return found


def test_every_run_error_code_is_registered_and_counted_as_itself() -> None:
    """The error metric counted the frameworks' codes (upstream_*, graph_*,
    checkpoint_unavailable, …) as `internal`."""
    raised = _adapter_codes()
    assert {"model_unavailable", "checkpoint_unavailable", "upstream_bad_response"} <= raised
    assert raised <= set(worker_errors.ALL_CODES)
    assert worker_errors.ALL_CODES == codes.run_error_codes()
    m = WorkerMetrics(CollectorRegistry())
    for code in worker_errors.ALL_CODES:
        assert m.error_label(code) == code
    # An agent's own AgentError code is its own: not a runlog bug.
    assert m.error_label("my_agents_code") == "other"


def test_worker_codes_take_their_flag_from_the_registry() -> None:
    for name in worker_errors.ALL_CODES:
        assert worker_errors.RunFailure(name).retryable is codes.get(name).retryable, name
    from workers.frameworks import agui

    for name, (retryable, _) in agui.CODES.items():
        assert codes.get(name).retryable is retryable, name


def test_protocol_doc_tables_are_generated_from_the_registry() -> None:
    text = DOC.read_text()
    assert codes.markdown(text) == text, (
        "docs/protocol.md's error tables are stale: run "
        "`python -m broker.codes --write docs/protocol.md`"
    )
    out = subprocess.run([sys.executable, "-m", "broker.codes"], capture_output=True, text=True,
                         check=True, timeout=60, cwd=ROOT)  # fmt: skip
    assert out.stdout == codes.errors_table() + "\n" + codes.disconnect_table()
    for name, entry in codes.CODES.items():
        if entry.kind in ("request", "process") or entry.close is not None:
            assert f"`{name}`" in text, name


def test_the_generated_section_must_exist() -> None:
    with pytest.raises(ValueError):
        codes.markdown("# no tables here\n")


def test_the_workers_run_error_table_agrees_with_the_registry() -> None:
    """docs/workers.md's hand-written table (its causes say more than a
    meaning): each code registered as a run_error, with its flag."""
    text = (ROOT / "docs" / "workers.md").read_text()
    section = text.split("## Error codes in `run_error`", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| ([a-z ]+) \|", section, re.M)
    assert len(rows) >= 10
    for name, retry in rows:
        assert name in worker_errors.ALL_CODES, name
        if retry in ("yes", "no"):
            assert codes.get(name).retryable is (retry == "yes"), name
