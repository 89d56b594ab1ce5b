"""The console's trust boundary, over real HTTP: `GET /v1/config` lists this
deployment's gateways (no token needed), and the console page's CSP lets it
connect to its own origin and those gateways only. The browser side (the page
ignores unlisted `#gateways=`) is in tests/test_browser.py."""

from __future__ import annotations

import dataclasses

import aiohttp
import pytest

from broker import errors
from broker.settings import Settings
from gateway.app import build_app

from .gw import running_gateway


def _directives(csp: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in csp.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


async def _console_csp(http: aiohttp.ClientSession, url: str) -> dict[str, list[str]]:
    async with http.get(url + "/") as r:
        assert r.status == 200
        assert r.content_type == "text/html"
        return _directives(r.headers["Content-Security-Policy"])


async def test_by_default_the_console_may_connect_to_this_gateway_only(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_gateway(settings) as gw:
        csp = await _console_csp(http, gw.url)
        ws_origin = gw.url.replace("http://", "ws://")
        assert csp["connect-src"] == ["'self'", gw.url, ws_origin]
        assert csp["script-src"] == ["'self'"] and csp["default-src"] == ["'self'"]
        async with http.get(gw.url + "/v1/config") as r:  # no token
            assert r.status == 200, await r.text()
            assert await r.json() == {"gateways": [gw.url]}


async def test_config_and_csp_list_the_deployments_gateways(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    listed = " https://gw1.example , HTTPS://GW2.Example:8443/runlog/, http://10.0.0.7:80,"
    async with running_gateway(settings, gateway_urls=listed) as gw:
        async with http.get(gw.url + "/v1/config") as r:
            assert r.status == 200, await r.text()
            assert await r.json() == {
                "gateways": ["https://gw1.example", "https://gw2.example:8443/runlog",
                             "http://10.0.0.7"],
            }  # fmt: skip
            assert r.headers["Cache-Control"] == "no-cache"
        csp = await _console_csp(http, gw.url)
        # This gateway's own origin is 'self' (the page is served from it);
        # a public URL not in the list is not added.
        assert csp["connect-src"] == [
            "'self'",
            "https://gw1.example", "wss://gw1.example",
            "https://gw2.example:8443", "wss://gw2.example:8443",
            "http://10.0.0.7", "ws://10.0.0.7",
        ]  # fmt: skip


async def test_config_is_in_the_openapi_document_without_security(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_gateway(settings) as gw, http.get(gw.url + "/v1/openapi.json") as r:
        op = (await r.json())["paths"]["/v1/config"]["get"]
    assert op["security"] == []
    schema = op["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["gateways"]


@pytest.mark.parametrize(
    "value",
    [
        "javascript:alert(1)",
        "ftp://gw.example",
        "https://",
        "gw.example:8080",
        "https://user:pw@gw.example",
        "https://gw.example/?x=1",
        "https://gw.example/#frag",
        "https://gw.example:99999",
        "https://gw.example/a b",
        "https://gw.example;script-src *",
    ],
)
def test_a_bad_gateway_url_is_refused_at_startup_with_its_setting(
    settings: Settings, value: str
) -> None:
    with pytest.raises(errors.InvalidSetting) as e:
        build_app(dataclasses.replace(settings, gateway_urls=f"https://ok.example,{value}"))
    assert e.value.code == "invalid_setting"
    assert "RUNLOG_GATEWAY_URLS" in e.value.detail and repr(value.strip()) in e.value.detail
