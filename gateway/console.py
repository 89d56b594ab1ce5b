"""The web console's trust boundary: which gateways a console page may talk to.

A console link carries a bearer token and may name gateways to fail over to
(`#gateways=`). Anyone can write a link, so the page does not take those
names on trust. It uses its own origin and the gateways this deployment lists
(`gateway_urls`, served at `GET /v1/config` by the gateway that served the
page), and ignores the rest with a visible notice. The page's CSP
`connect-src` allows those origins and nothing else, so even a bug in the
page, or script injected into it, cannot send the token to a stranger.

All of it is computed once from the settings when the app is built (no I/O);
a bad URL is `invalid_setting` at startup, never a surprise in a browser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from broker import errors
from broker.settings import Settings

from .context import json_response

_DEFAULT_PORTS = {"http": 80, "https": 443}
_WS_SCHEMES = {"http": "ws", "https": "wss"}
# A host name or an IPv4 address (a CSP source cannot name an IPv6 literal),
# and a plain path: nothing that could end a CSP source or directive.
_HOST = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
_PATH = re.compile(r"[A-Za-z0-9._~%/-]*")

# The console page runs only its own scripts and connects only where it may.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src {connect}; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'none'"
)


@dataclass(frozen=True)
class ListedGateway:
    """One listed gateway: its canonical URL and its origin."""

    url: str  # scheme://host[:port][/path], lower-case, default port and trailing / dropped
    origin: str  # scheme://host[:port]
    ws_origin: str  # the same with ws: or wss:


@dataclass(frozen=True)
class ConsoleConfig:
    gateways: tuple[ListedGateway, ...]  # in the operator's order, each once
    csp: str

    @classmethod
    def from_settings(cls, settings: Settings) -> ConsoleConfig:
        if settings.gateway_urls.strip():
            setting, raw = "gateway_urls", settings.gateway_urls
        else:
            own = f"http://{settings.gateway_host}:{settings.gateway_port}"
            setting, raw = "public_url", settings.public_url or own
        gateways: dict[str, ListedGateway] = {}
        for entry in raw.split(","):
            if entry.strip():
                g = parse_gateway(setting, entry.strip())
                gateways.setdefault(g.url, g)
        sources = ["'self'"]
        for g in gateways.values():
            sources += [s for s in (g.origin, g.ws_origin) if s not in sources]
        return cls(tuple(gateways.values()), _CSP.format(connect=" ".join(sources)))


def parse_gateway(setting: str, value: str) -> ListedGateway:
    """A gateway URL as browsers will compare it, or InvalidSetting naming `setting`."""

    def bad(why: str) -> errors.InvalidSetting:
        return errors.InvalidSetting(setting, value, why)

    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        raise bad(f"is not a URL ({e})") from e
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise bad("is not an http:// or https:// URL")
    if "@" in parts.netloc or "?" in value or "#" in value:
        raise bad("must not carry a user, a query or a fragment")
    host = (parts.hostname or "").lower()
    if not host or not _HOST.fullmatch(host) or not _PATH.fullmatch(parts.path):
        raise bad("is not a plain URL (scheme://host[:port][/path])")
    netloc = host if port is None or port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return ListedGateway(
        url=f"{scheme}://{netloc}{parts.path.rstrip('/')}",
        origin=f"{scheme}://{netloc}",
        ws_origin=f"{_WS_SCHEMES[scheme]}://{netloc}",
    )


CONSOLE: web.AppKey[ConsoleConfig] = web.AppKey("console", ConsoleConfig)


async def config(request: web.Request) -> web.Response:
    """`GET /v1/config`: public facts a console needs before it has a token."""
    gateways = [g.url for g in request.app[CONSOLE].gateways]
    resp = json_response({"gateways": gateways})
    resp.headers["Cache-Control"] = "no-cache"
    return resp
