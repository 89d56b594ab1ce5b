"""Schemathesis over /v1/openapi.json of a running gateway: no 5xx, no
status the document does not list, and no warning (issue 10, "Done when";
issue 23, item 7: a warning is the document and the server disagreeing about
what a valid request is, so it fails the run too).

Bounded here (`FUZZ_MAX_EXAMPLES`, default 8 per operation, `FUZZ_SEED`
default 10: about 1,100 requests in about a minute); `make fuzz` runs the same
with many more examples and a fresh seed. Path ids are drawn mostly from a
real session (with a run, an approval and members to change) of the token's
user, so requests reach the handlers' far ends, not only `not_a_member`. The
gateway runs in this process, so a traceback it logs fails the test too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker import approvals, errors, ids
from broker.runtime import Broker
from broker.settings import Settings
from gateway import openapi

from .gw import running_gateway, write_run

ST = Path(sys.executable).parent / "st"
MEMBERS = 10
CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)


def _config(ids: dict[str, list[str]]) -> str:
    """schemathesis.toml: dictionaries of real ids for the path parameters,
    and every warning fails the run (a warning is the document and the
    server disagreeing about what a valid request is)."""
    lines = [
        "max-stream-events = 1",  # an event stream answered is read to its first event
        "",
        "[warnings]",
        "fail-on = true",
        "",
    ]
    for name, value in ids.items():
        lines += [f"[dictionaries.{name}s]", f"values = {json.dumps(value)}", ""]
    lines.append("[parameters]")
    for name in ids:
        lines.append(f'"path.{name}" = {{ dictionary = "{name}s", probability = 0.5 }}')
    lines += [
        "",
        # The AG-UI endpoints answer only as an event stream (400 otherwise),
        # as an HttpAgent always asks.
        "[[operations]]",
        'include-path-regex = "^/v1/compat/agui/"',
        'headers = { Accept = "text/event-stream" }',
        "",
        # A WebSocket upgrade is no request an HTTP fuzzer can make: a valid
        # one is a 101 and a WebSocket conversation; every plain GET is the
        # 400 the document lists (tests/test_gateway_ws.py tests the upgrade).
        # A member's role change or removal reaches the store mostly with ids
        # that exist (and are put back: see _keep_members).
        "[[operations]]",
        'include-path-regex = "^/v1/sessions/[{]session_id[}]/members/"',
        'parameters = { "path.session_id" = { dictionary = "session_ids", probability = 0.9 },'
        ' "path.user_id" = { dictionary = "user_ids", probability = 0.9 } }',
        "",
        "[[operations]]",
        'include-path = "/v1/ws"',
        "warnings = false",
    ]
    return "\n".join(lines) + "\n"


async def _keep_members(broker: Broker, sid: str, members: list[str]) -> None:
    """The fuzz session's members to change and remove, put back every
    second (a removal works once; a role change may make one an owner), and
    the fuzzer its owner: what the fuzzer changes, it changes for a moment."""
    while True:
        await asyncio.sleep(1.0)
        await _put_back(broker, sid, members)


async def _put_back(broker: Broker, sid: str, members: list[str]) -> None:
    """One pass; a change the fuzzer's own races refuse waits for the next."""
    for user, role in ("fuzzer", "owner"), *((m, "viewer") for m in members):
        info = await broker.store.session_info(sid, runs_limit=1)
        owner = next(u for u, r in info.members if r == "owner")  # one always is
        with contextlib.suppress(errors.Forbidden, errors.LastOwner):
            await broker.store.add_member(sid, user, role, owner)


async def test_schemathesis_finds_no_server_error_nor_undocumented_status(
    settings: Settings, broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    examples = int(os.environ.get("FUZZ_MAX_EXAMPLES", "8"))
    seed = os.environ.get("FUZZ_SEED", "10")  # fixed in the suite: the same cases every run
    sid = await broker.store.create_session("fuzzer", "fuzz")
    run_id, _ = await write_run(broker, sid, 3, end=False)
    aid = f"ap_{'F' * 21}{time.time_ns() % 10}"
    await approvals.create(broker.store, approval_id=aid, run_id=run_id, epoch=1,
                           tool_call_id="c", summary="s",
                           expires_at_ms=int(time.time() * 1000) + 3_600_000)  # fmt: skip
    cfg = tmp_path / "schemathesis.toml"
    members = [f"fuzz-{i:02}" for i in range(MEMBERS)]
    await _put_back(broker, sid, members)
    keeper = asyncio.create_task(_keep_members(broker, sid, members))
    cfg.write_text(_config({"session_id": [sid], "run_id": [run_id], "approval_id": [aid],
                            "user_id": members}))  # fmt: skip
    async with running_gateway(settings, control_rate_per_s=1000) as gw:
        proc = await asyncio.create_subprocess_exec(
            str(ST), "--config-file", str(cfg), "--no-color", "run",
            f"{gw.url}/v1/openapi.json", "--checks", CHECKS, "--max-examples", str(examples),
            "--phases", "examples,coverage,fuzzing", "--workers", "1", "--seed", seed,
            "--request-timeout", "10", "--generation-database", "none",
            "--header", f"Authorization: Bearer {gw.token('fuzzer')}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
        out, _ = await proc.communicate()
    keeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await keeper
    report = out.decode(errors="replace")
    # The failures (and warnings) come after the last case's long output.
    start = min(i for i in (report.find("FAILURES"), report.find("WARNINGS"), len(report))
                if i >= 0)  # fmt: skip
    assert proc.returncode == 0, report[start : start + 8000] or report[-6000:]
    print(report[-3000:])
    # Ours: aiohttp's own parser refusals (schemathesis probes a NUL in a
    # header) are the error middleware's business, not the document's.
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records
              if r.name.startswith(("gateway", "broker")) and r.levelno >= logging.WARNING]  # fmt: skip
    assert errors == []


# -- the document's rules, without a server (each was a fuzz finding: a status
# or a constraint the server has and the document did not say)


def _doc(**kw: object) -> dict[str, Any]:
    return openapi.document(Settings(**kw))  # type: ignore[arg-type]


def test_every_operation_lists_the_parsers_refusals_and_its_own_conflicts() -> None:
    doc = _doc()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert {"400", "414", "431", "503"} <= set(op["responses"]), (method, path)
    # 409 run_ended: an interrupt of a run that has ended.
    assert "409" in doc["paths"]["/v1/runs/{run_id}/interrupt"]["post"]["responses"]
    assert "run_ended" in doc["paths"]["/v1/runs/{run_id}/interrupt"]["post"]["responses"][
        "409"]["description"]  # fmt: skip
    assert "400" in doc["paths"]["/v1/ws"]["get"]["responses"]  # a plain GET: no upgrade


def test_the_document_has_the_gateways_limits_and_models() -> None:
    doc = _doc(page_max_events=250, models="m-1, m-2")
    params = doc["paths"]["/v1/runs/{run_id}/events"]["get"]["parameters"]
    (limit,) = [p for p in params if p["name"] == "limit"]
    assert limit["schema"]["maximum"] == 250
    schemas = doc["components"]["schemas"]
    assert schemas["StartRun"]["properties"]["model"]["enum"] == ["", "scripted-demo", "m-1", "m-2"]
    assert schemas["UpdateSession"]["minProperties"] == 1  # PATCH {} is 400
    assert all("anyOf" not in p for p in schemas["UpdateSession"]["properties"].values())


@pytest.mark.parametrize("value", ["alice", "a b", "é", "日本", "x" * 200, "\U0001f600",
                                   "", " a", "a ", "x" * 201, "a\u202eb", "a\u200bb",
                                   "a\x00b", "a\u00a0b", "\ue000", "a\tb"])  # fmt: skip
def test_the_user_id_pattern_is_the_servers_rule(value: str) -> None:
    schema = _doc()["components"]["schemas"]["UserId"]
    fits = (schema["minLength"] <= len(value) <= schema["maxLength"]
            and re.fullmatch(schema["pattern"], value) is not None)  # fmt: skip
    assert fits is (ids.user_id_problem(value) is None)
