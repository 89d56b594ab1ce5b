"""The model allow-list: a run may name "" (the adapter's default), the
adapter's default model, or a name in the `models` setting. The gateway
refuses anything else (400 model_not_allowed) before a run exists; a worker
given such a run anyway fails it with model_not_allowed without calling the
provider."""

from __future__ import annotations

from typing import Any

import aiohttp
import msgspec
import pytest

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from workers.adapters.openai import OpenAIAdapter

from .fakes.providers import FakeProvider, openai_stream
from .gw import RunningGateway, running_gateway, session_with
from .workerkit import of, read_run, running_worker


async def _start(
    http: aiohttp.ClientSession, gw: RunningGateway, sid: str, model: str
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{gw.url}/v1/sessions/{sid}/runs", json={"input": "hi", "model": model},
                         headers=gw.headers("alice")) as r:  # fmt: skip
        return r.status, await r.json()


async def test_the_gateway_refuses_a_model_nobody_allowed(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings) as gw:  # the defaults: scripted, no `models`
        sid = await session_with(http, gw, "alice")
        status, body = await _start(http, gw, sid, "o1-pro-2025-03-19")
        assert status == 400, body
        assert body["error"]["code"] == "model_not_allowed"
        assert "o1-pro-2025-03-19" in body["error"]["message"]
        assert (await broker.store.session_info(sid)).runs == []  # no run was created


@pytest.mark.parametrize(
    ("adapter", "model", "allowed"),
    [
        ("scripted", "", True),
        ("scripted", "scripted-demo", True),
        ("scripted", "gpt-4.1", True),  # in `models`
        ("scripted", "gpt-4o-mini", False),  # openai's default, but openai is not the adapter
        ("openai", "gpt-4o-mini", True),
        ("openai", "claude-sonnet-4-5", False),
        ("anthropic", "claude-sonnet-4-5", True),
        ("anthropic", "gpt-4.1 ", False),  # no trimming of what a client sends
        ("openai", "GPT-4.1", False),  # nor case folding
    ],
)
async def test_the_gateway_allows_the_default_and_the_listed_models(
    adapter: str,
    model: str,
    allowed: bool,
    settings: Settings,
    http: aiohttp.ClientSession,
    broker: Broker,
) -> None:
    async with running_gateway(settings, model_adapter=adapter, models="gpt-4.1, o3") as gw:
        sid = await session_with(http, gw, "alice")
        status, body = await _start(http, gw, sid, model)
        runs = (await broker.store.session_info(sid)).runs
        if allowed:
            assert status == 202, body
            assert [r.run_id for r in runs] == [body["run_id"]]
        else:
            assert (status, body["error"]["code"]) == (400, "model_not_allowed"), body
            assert runs == []


async def test_a_worker_fails_a_disallowed_run_without_calling_the_provider(
    settings: Settings,
) -> None:
    async with FakeProvider() as provider:
        adapter = OpenAIAdapter(provider.url + "/v1", "sk-test", "gpt-4o-mini")
        async with running_worker(settings, adapter=adapter) as (b, _):
            sid = await b.store.create_session("alice")
            # Straight to the broker: as if a gateway with another list let it through.
            run_id = await b.start_run(sid, "alice", input="hi", model="o1-pro")
            evs = await read_run(b, run_id)
        assert provider.requests == []
    start, err, end = evs
    assert isinstance(start, events.RunStart) and start.model == "o1-pro"
    assert isinstance(err, events.RunError) and (err.code, err.retryable) == (
        "model_not_allowed",
        False,
    )
    assert isinstance(end, events.RunEnd) and end.status == "failed"


async def test_a_worker_runs_a_listed_model(settings: Settings) -> None:
    async with FakeProvider() as provider:
        provider.push(openai_stream(text=["fine"]))
        adapter = OpenAIAdapter(provider.url + "/v1", "sk-test", "gpt-4o-mini")
        async with running_worker(settings, adapter=adapter, models="gpt-4.1") as (b, _):
            sid = await b.store.create_session("alice")
            run_id = await b.start_run(sid, "alice", input="hi", model="gpt-4.1")
            evs = await read_run(b, run_id)
        (request,) = provider.requests
        assert msgspec.json.decode(request.body)["model"] == "gpt-4.1"
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    assert of(evs, events.RunError) == []
