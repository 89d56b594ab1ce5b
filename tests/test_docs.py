"""The docs run as written: every fenced code block of README.md and
docs/*.md is either run here against a real stack or marked as not run, with
the reason, so a quickstart cannot drift from the product.

The mark is an HTML comment on the line right before the block's fence (a
block without one fails `test_every_block_is_run_or_marked`):

    <!-- runs: what it needs, or what it shows -->
    <!-- runs in tests/test_x.py: how that test runs it -->
    <!-- output: what it is (not run) -->
    <!-- fragment: why it is not run -->

A json or yaml block that is not run must parse. A `runs` block may add `prints "text"` (several: `prints "a", "b"`): its
output must hold each text. `NAME=value` words in a `runs` note are set in
its environment (a key the doc says the reader has; no request uses it).

A `runs` block runs with the tool its fence names (`sh`: bash with `set -euo
pipefail`, `python`: the venv's python, `js`: node, as an ES module), the
blocks of one file in order, each file's in parallel, in a folder that
looks like the reader's after `make run`: `.venv` (its bin on PATH, so
`runlog` resolves), `.runlog/` with the running stack's secret and
`up.json` (so `runlog token` and `runlog tail` find it), `node_modules`
with the JS clients. What a `sh` block exports, the next blocks of its file
see, as in the reader's terminal. The one substitution: the stack's gateway
stands in for `make run`'s, so `http://127.0.0.1:8080` in a block becomes
its URL. The stack is real: NATS, PostgreSQL, a gateway and a worker with
the default (scripted) model, which asks an approval in most runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml

from broker.settings import Settings
from runlog import secret
from runlog import stack as up_file

from .gw import RunningGateway, running_gateway
from .helpers import Stack
from .workerkit import running_worker

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAKE_RUN_URL = "http://127.0.0.1:8080"
RUNNERS = {"sh": "bash", "python": "python", "js": "node"}
_SHELL_OWN = {"_", "SHLVL", "PWD", "OLDPWD"}  # what bash exports of its own
BLOCK_TIMEOUT_S = 60.0

_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
_MARK = re.compile(
    r"^<!--\s*(runs in (?P<test>\S+?)|runs|output|fragment)\s*(?::\s*(?P<note>.*?))?\s*-->$"
)
_PRINTS = re.compile(r'\bprints ((?:"[^"]+"(?:,\s*)?)+)')
_ENV_WORD = re.compile(r"\b([A-Z][A-Z0-9_]+)=([^\s;,]+)")


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    kind: str  # "runs", "runs in", "output", "fragment", or "" (unmarked)
    note: str
    test: str  # for "runs in": the test file

    def __str__(self) -> str:
        return f"{_doc_id(self.path)}:{self.line} ({self.lang or 'no language'})"

    @property
    def prints(self) -> list[str]:
        m = _PRINTS.search(self.note)
        return re.findall(r'"([^"]+)"', m.group(1)) if m else []

    @property
    def env(self) -> dict[str, str]:
        return dict(_ENV_WORD.findall(self.note))


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence.group(1)):
            end += 1
        mark = _MARK.match(lines[i - 1].strip()) if i else None
        kind = note = test = ""
        if mark:
            kind = "runs in" if mark.group("test") else mark.group(1)
            note, test = mark.group("note") or "", mark.group("test") or ""
        code = "\n".join(lines[i + 1 : end]) + "\n"
        out.append(Block(path, i + 1, fence.group(2), code, kind, note, test))
        i = end + 1
    return out


def _doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


@pytest.mark.parametrize("path", DOCS, ids=_doc_id)
def test_every_block_is_run_or_marked(path: Path) -> None:
    problems = []
    for b in blocks_of(path):
        if not b.kind:
            problems.append(
                f"{b}: neither run nor marked; put `<!-- runs: … -->` (tests/test_docs.py runs it), "
                "`<!-- output: … -->` or `<!-- fragment: why -->` on the line before its fence"
            )
        elif b.kind in ("output", "fragment", "runs in") and not b.note:
            problems.append(f"{b}: `{b.kind}` needs its reason after a colon")
        elif b.kind == "runs" and b.lang not in RUNNERS:
            problems.append(f"{b}: `runs`, but no runner for {b.lang!r} (one of {list(RUNNERS)})")
        elif b.kind == "runs in":
            test = ROOT / b.test
            if not test.is_file() or path.name not in test.read_text():
                problems.append(f"{b}: {b.test} does not exist or does not read {path.name}")
        if b.kind != "runs" and b.lang in ("json", "yaml"):
            try:
                json.loads(b.code) if b.lang == "json" else yaml.safe_load(b.code)
            except (ValueError, yaml.YAMLError) as e:
                problems.append(f"{b}: not {b.lang}: {e}")
    assert not problems, "\n".join(problems)


def test_the_marks_are_read(tmp_path: Path) -> None:
    """The parser itself, on a doc of each kind of block (an unmarked block
    is found, a mark one blank line away does not count)."""
    doc = ROOT / "README.md"
    got = blocks_of(doc)
    assert got and all(b.path == doc for b in got)
    fake = (
        '<!-- runs: with OPENAI_API_KEY=sk-x; prints "a", "b c" -->\n```sh\necho a b c\n```\n'
        "<!-- fragment: elided -->\n\n```python\n...\n```\n"
        "<!-- runs in tests/test_up.py: under runlog up -->\n```python\npass\n```\n"
    )
    tmp = tmp_path / "fake.md"
    tmp.write_text(fake)
    a, b, c = blocks_of(tmp)
    assert (a.kind, a.lang, a.code, a.prints, a.env) == (
        "runs", "sh", "echo a b c\n", ["a", "b c"], {"OPENAI_API_KEY": "sk-x"}
    )  # fmt: skip
    assert (b.kind, b.line) == ("", 7)
    assert (c.kind, c.test, c.note) == ("runs in", "tests/test_up.py", "under runlog up")


# -- running them


@dataclasses.dataclass
class Reader:
    """The reader's folder after `make run`, and the stack it points at."""

    folder: Path
    gateway: RunningGateway
    env: dict[str, str]


@pytest_asyncio.fixture(loop_scope="session")
async def reader(settings: Settings, stack: Stack, tmp_path: Path) -> AsyncIterator[Reader]:
    missing = [tool for tool in ("bash", "curl", "jq", "node") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"the docs' quickstarts need {', '.join(missing)} (`make test` installs jq)")
    if not (ROOT / "tests" / "clients" / "node_modules").is_dir():
        pytest.fail("tests/clients/node_modules is missing: `make test` installs it (npm ci)")
    folder = tmp_path / "app"
    (folder / ".runlog").mkdir(parents=True)
    venv = Path(sys.executable).parent.parent
    (folder / ".venv").symlink_to(venv)
    (folder / "node_modules").symlink_to(ROOT / "tests" / "clients" / "node_modules")
    jwt_secret = secret.create(folder / ".runlog")
    s = dataclasses.replace(settings, jwt_secret=jwt_secret, sse_heartbeat_s=1.0)
    async with running_worker(s), running_gateway(s) as gw:
        up_file.write(
            folder / ".runlog",
            up_file.Running(
                pid=os.getpid(),
                nats_url=stack.nats_url,
                database_url=stack.database_url,
                gateway_urls=[gw.url],
            ),
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        yield Reader(folder, gw, env)


async def _run_block(r: Reader, b: Block, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Run one block; its output, and the environment the next one sees."""
    code = b.code.replace(MAKE_RUN_URL, r.gateway.url)
    stem = f"{b.path.stem}-{b.line}"
    env_out = r.folder / f".{stem}.env"
    if b.lang == "sh":
        script = r.folder / f".{stem}.sh"
        script.write_text(f"{code}\nenv -0 > {env_out}\n")
        argv = ["bash", "-euo", "pipefail", str(script)]
    elif b.lang == "python":
        script = r.folder / f".{stem}.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    else:
        script = r.folder / f".{stem}.mjs"
        script.write_text(code)
        argv = ["node", str(script)]
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=r.folder, env={**env, **b.env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    printed = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            printed.extend(chunk)
        await proc.wait()

    try:
        await asyncio.wait_for(read(), BLOCK_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(
            f"{b}: still running after {BLOCK_TIMEOUT_S:.0f} s; it printed\n"
            + printed.decode(errors="replace")
        ) from None
    out = printed.decode(errors="replace")
    if proc.returncode != 0:
        raise AssertionError(f"{b}: exit {proc.returncode}\n{out}")
    missing = [t for t in b.prints if t not in out]
    if missing:
        raise AssertionError(f"{b}: printed none of {missing}\n{out}")
    if b.lang == "sh":
        pairs = (kv.partition("=") for kv in env_out.read_text().split("\0") if kv)
        env = {k: v for k, _, v in pairs if k not in _SHELL_OWN}
    return out, env


async def _run_doc(r: Reader, path: Path) -> list[str]:
    """The runnable blocks of one doc, in order; a failure stops the doc."""
    env = dict(r.env)
    for b in blocks_of(path):
        if b.kind != "runs":
            continue
        t0 = time.monotonic()
        try:
            out, env = await _run_block(r, b, env)
        except AssertionError as e:
            return [str(e)]
        print(f"{b}: {time.monotonic() - t0:.1f} s, {len(out)} characters printed")
    return []


RUN_DOCS = [p for p in DOCS if any(b.kind == "runs" for b in blocks_of(p))]


@pytest.mark.timeout(240)
async def test_the_blocks_that_run(reader: Reader) -> None:
    """Every `runs` block, against the real stack: the docs in parallel."""
    assert RUN_DOCS, "no doc has a block that runs"
    t0 = time.monotonic()
    failures = await asyncio.gather(*(_run_doc(reader, p) for p in RUN_DOCS))
    print(f"{sum(b.kind == 'runs' for p in RUN_DOCS for b in blocks_of(p))} blocks "
          f"in {time.monotonic() - t0:.1f} s")  # fmt: skip
    problems = [f for fs in failures for f in fs]
    assert not problems, "\n\n".join(problems)
