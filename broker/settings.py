"""Settings, parsed once into a frozen object and passed explicitly.

This is the only module that reads the environment. Every setting has an
environment variable (`RUNLOG_<NAME>`) and a CLI flag (`--name-with-dashes`);
a flag wins over the variable, the variable over the default. `runlog
settings` prints the table below; docs/configuration.md is generated from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "RUNLOG_"


def _opt(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, kw_only=True)
class Settings:
    # -- where things are
    data_dir: Path = _opt(
        Path(".runlog"), "Folder for the embedded NATS and PostgreSQL data (kept across restarts)."
    )
    nats_url: str = _opt(
        "", "NATS server URL(s), comma-separated. Empty: `runlog up` starts an embedded one."
    )
    database_url: str = _opt(
        "", "PostgreSQL DSN. Empty: `runlog up` starts an embedded PostgreSQL."
    )
    embedded_nats_port: int = _opt(4222, "Client port of the embedded nats-server (`runlog up`).")
    embedded_postgres_port: int = _opt(
        55432, "Port of the embedded PostgreSQL (`runlog up`), on 127.0.0.1."
    )
    log_level: str = _opt("info", "Log level: debug, info, warning or error.")
    # -- append path
    flush_interval_ms: float = _opt(
        2.0, "Longest an appended event waits for more events before its batch is committed (ms)."
    )
    flush_max_events: int = _opt(
        4000, "Most events committed in one transaction (events); a full batch flushes at once."
    )
    max_event_bytes: int = _opt(
        65536, "Largest encoded event accepted (bytes); larger ones get payload_too_large."
    )
    max_pending_events: int = _opt(
        200000,
        "Most events waiting to be committed per process (events); appenders wait past it.",
    )
    publish_retry_max_s: float = _opt(
        5.0, "Longest back-off between retries of a live publish that failed after commit (s)."
    )
    publish_backlog_max: int = _opt(
        10000,
        "Most committed batches waiting to be published (messages); older ones are dropped "
        "and subscribers fill the gap from PostgreSQL.",
    )
    db_pool_size: int = _opt(8, "PostgreSQL connections per process (connections).")
    db_retry_s: float = _opt(
        30.0, "How long a commit is retried while PostgreSQL is unreachable (s)."
    )
    # -- read path
    position_check_s: float = _opt(
        1.0,
        "How often an idle subscription compares its position with PostgreSQL, to catch a "
        "tail that never arrived live (s).",
    )
    page_max_events: int = _opt(1000, "Most events in one page of a replay (events).")
    live_buffer_max: int = _opt(
        10000,
        "Most live events a subscription buffers while it replays (events); past it, the "
        "buffer is dropped and refilled from PostgreSQL.",
    )
    # -- JetStream retention (the live feed is short-lived; PostgreSQL keeps the log)
    events_max_age_s: float = _opt(
        3600.0, "Age after which JetStream drops live-feed messages (s)."
    )
    dedupe_window_s: float = _opt(120.0, "JetStream duplicate-detection window (s).")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("settings (also RUNLOG_<NAME> environment variables)")
        for f in dataclasses.fields(cls):
            group.add_argument(
                "--" + f.name.replace("_", "-"),
                dest=f"setting_{f.name}",
                default=None,
                metavar=f.name.upper(),
                help=f"{f.metadata['doc']} Default: {f.default}.",
            )

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> Settings:
        overrides = {}
        for f in dataclasses.fields(cls):
            raw = getattr(args, f"setting_{f.name}", None)
            if raw is not None:
                overrides[f.name] = _convert(f, raw)
        return cls.from_env(environ, **overrides)

    @classmethod
    def table(cls) -> list[tuple[str, str, str, str]]:
        """(env var, flag, default, doc) for every setting."""
        return [
            (
                ENV_PREFIX + f.name.upper(),
                "--" + f.name.replace("_", "-"),
                str(f.default),
                f.metadata["doc"],
            )
            for f in dataclasses.fields(cls)
        ]


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    typ = f.type if isinstance(f.type, str) else f.type.__name__
    try:
        if typ == "int":
            return int(raw)
        if typ == "float":
            return float(raw)
        if typ == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ == "Path":
            return Path(raw)
    except ValueError as e:
        raise SystemExit(f"runlog: bad value for {ENV_PREFIX}{f.name.upper()}: {raw!r}") from e
    return raw
