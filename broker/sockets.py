"""Loopback ports and listening sockets: pick a free port, hold one, test one.

Shared by the launcher of the embedded servers (`runlog/embedded.py`), the
supervisors of `runlog up` and the gateway's own listener (`gateway/main.py`),
which may be handed a socket already bound."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now. Another process may take it before
    the server binds it; where the server can be given a socket or bind port 0
    itself, use `bind_free_port` instead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def bind_free_port(host: str = LOOPBACK, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to a free port of `host` the kernel picked, not
    listening yet; its port is `getsockname()[1]`. Unlike `free_port` the port
    is held from the start: no other process can bind it before a server
    listens on this socket (without SO_REUSEADDR, which would let another
    socket bind it too until one listens). reuse_port: SO_REUSEPORT, so that
    processes of the same user can bind the port beside it (a gateway group)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on `host`:`port` right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # Servers set SO_REUSEADDR too, so TIME_WAIT leftovers don't count as busy.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
