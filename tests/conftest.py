"""Test fixtures: real NATS and real PostgreSQL, started once per test session
by the same launcher `runlog up` uses (or external ones when
RUNLOG_NATS_URL / RUNLOG_DATABASE_URL are set).

Tests that kill or restart a server use `killable`, a private pair started
from the same launcher, so they never disturb the shared one (and work the
same when the shared one is external). State is not reset between tests:
every test makes its own sessions and runs, whose ids are random.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest
import pytest_asyncio
from playwright.async_api import Browser, async_playwright

from broker import migrate
from broker.runtime import Broker
from broker.settings import Settings
from runlog.embedded import NatsProcess, PostgresProcess

from . import pgseed
from .browser_helpers import CHROMIUM, LAUNCH_ARGS
from .helpers import FIXTURE_TASK_PREFIX, KillableStack, Stack, make_settings
from .workerkit import purge_jobs


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="runlog-test-") as d:
        os.chmod(d, 0o755)
        yield Path(d)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stack(tmp_root: Path) -> AsyncIterator[Stack]:
    nats_url = os.environ.get("RUNLOG_NATS_URL", "")
    database_url = os.environ.get("RUNLOG_DATABASE_URL", "")
    started: list[NatsProcess | PostgresProcess] = []

    async def start_nats() -> None:
        nonlocal nats_url
        nats = NatsProcess(tmp_root / "nats")
        started.append(nats)  # stopped in any case (a no-op if it never started)
        await nats.start()
        nats_url = nats.url

    async def start_pg() -> None:
        nonlocal database_url
        # A copy of the session's migrated data folder: no initdb, no migration.
        pgseed.copy_to(await pgseed.seed(tmp_root), tmp_root / "pg")
        pg = PostgresProcess(tmp_root / "pg", fast_init=True)
        started.append(pg)
        await pg.start()
        database_url = pg.url

    try:
        async with asyncio.TaskGroup() as starting:  # side by side: seconds each
            if not nats_url:
                starting.create_task(start_nats())
            if not database_url:
                starting.create_task(start_pg())
        await migrate.apply(database_url)
        yield Stack(nats_url, database_url)
    finally:
        for p in reversed(started):
            await p.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def killable(tmp_root: Path) -> AsyncIterator[KillableStack]:
    nats = NatsProcess(tmp_root / "k-nats")
    pg = PostgresProcess(tmp_root / "k-pg", fast_init=True)

    async def start_pg() -> None:
        pgseed.copy_to(await pgseed.seed(tmp_root), tmp_root / "k-pg")
        await pg.start()

    try:
        async with asyncio.TaskGroup() as starting:
            starting.create_task(nats.start())
            starting.create_task(start_pg())
        await migrate.apply(pg.url)
        yield KillableStack(nats, pg)
    finally:
        await pg.stop()
        await nats.stop()


@pytest.fixture(scope="session")
def settings(stack: Stack) -> Settings:
    return make_settings(stack)


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    # One Chromium for the session: each test has contexts of its own (Pages).
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    b = await Broker.connect(settings, name="runlog-test")
    try:
        yield b
    finally:
        await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def client(settings: Settings) -> AsyncIterator[Broker]:
    """A broker with no worker: starts runs, decides, reads (the job messages
    earlier tests left unconsumed are dropped first)."""
    b = await Broker.connect(settings, name="test-client")
    await purge_jobs(b)
    try:
        yield b
    finally:
        await b.close()


# -- the suite catches leaks by itself (as asyncpg's and aiohttp's test bases do)

_LEAK_GRACE_S = 5.0  # teardown callbacks and closing sockets may take a moment


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Also: a report's captured output with lone surrogates (a client's raw
    header bytes, which aiohttp decodes with surrogateescape) is shown
    backslash-escaped: pytest-xdist's workers send reports as UTF-8, which a
    surrogate cannot be, and crashed on them (tests/test_logformat.py)."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]
    return report


_CALL_FAILED = pytest.StashKey[bool]()


def _tcp_connections() -> set[tuple[object, object]]:
    """This process's open TCP connections (its gateways' and clients' alike)."""
    return {
        (c.laddr, c.raddr)
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.status != psutil.CONN_LISTEN
    }


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def no_leaks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fails a test that leaves asyncio tasks running or TCP connections open
    (checked after every fixture of the test is torn down; skipped when the
    test failed already, so the first failure is the one reported)."""
    tasks_before = asyncio.all_tasks()
    conns_before = _tcp_connections()
    yield
    if request.node.stash.get(_CALL_FAILED, True):
        return
    me = asyncio.current_task()
    deadline = time.monotonic() + _LEAK_GRACE_S
    while True:
        tasks = [
            t
            for t in asyncio.all_tasks() - tasks_before
            if t is not me and not t.done() and not t.get_name().startswith(FIXTURE_TASK_PREFIX)
        ]
        conns = _tcp_connections() - conns_before
        if (not tasks and not conns) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert not tasks, "tasks left running: " + ", ".join(
        f"{t.get_name()} ({t.get_coro()!r})" for t in tasks
    )
    assert not conns, f"TCP connections left open: {sorted(map(str, conns))}"


# -- markers: every test is exactly one of unit, integration or browser (by the
# fixtures it uses), and some are also slow (pyproject.toml registers them;
# `make test-fast` runs `unit and not slow`, `make test` runs everything).

# Fixtures that start (or stand on) a real NATS, PostgreSQL, gateway or worker
# process; item.fixturenames is the closure, so `settings`, `broker`, `client`
# and every module fixture built on `stack` count too.
SERVER_FIXTURES = frozenset({"stack", "killable", "up"})
BROWSER_FIXTURES = frozenset({"browser", "pages"})
# Modules whose tests start real servers in their bodies (no fixture to see).
SERVER_MODULES = frozenset({"test_embedded.py", "test_up.py"})
# Tests that take ten seconds or more on an idle 2-core machine, or a group of
# subprocess-bound ones that does together (a wheel build, a thousand runs,
# a drain under load, twenty `python -O` imports): outside `make test-fast`
# whatever their kind, and `-m "not slow"` leaves them out of any run. A
# module name marks the whole module, module::test one test (every
# parameter set of it).
SLOW = frozenset(
    {
        "test_fuzz.py",
        "test_packaging.py",
        "test_scale.py",
        "test_cluster.py",
        "test_catchup.py::test_a_replay_to_a_client_that_does_not_read_holds_no_page_and_a_bounded_queue",
        "test_dependency_contracts.py::test_a_broken_name_is_refused_at_import_under_python_O",
        "test_gateway_procs.py::test_up_with_gateway_processes_serves_from_each_on_one_port",
        "test_markers.py::test_no_test_of_the_suite_has_no_kind_or_two",
        "test_worker_outage.py::test_postgres_down_past_the_leases_fails_no_streaming_run",
        "test_worker_parking.py::test_a_thousand_waiting_runs_hold_no_slot_and_each_resumes_once",
    }
)
KINDS = ("unit", "integration", "browser")


def kind_of(item: pytest.Item) -> str:
    used = set(getattr(item, "fixturenames", ()))
    if used & BROWSER_FIXTURES:
        return "browser"
    if used & SERVER_FIXTURES or item.path.name in SERVER_MODULES:
        return "integration"
    return "unit"


def is_slow(item: pytest.Item) -> bool:
    module = item.path.name
    name = getattr(item, "originalname", item.name)  # every parameter set of a test
    return module in SLOW or f"{module}::{name}" in SLOW


# Every test collected, before -m or -k deselect any (tests/test_markers.py).
COLLECTED = pytest.StashKey[list[pytest.Item]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[COLLECTED] = list(items)
    for item in items:
        if not any(item.get_closest_marker(k) for k in KINDS):
            item.add_marker(kind_of(item))
        if is_slow(item):
            item.add_marker("slow")
