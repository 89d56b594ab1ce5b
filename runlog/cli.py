"""`runlog`: one command, one subcommand per process kind.

runlog up         embedded stack: nats-server + PostgreSQL, migrate, then
                  the worker(s) and gateway(s), restarted if they die;
                  Ctrl-C stops everything
runlog migrate    apply pending migrations to RUNLOG_DATABASE_URL
runlog gateway    a gateway (REST, SSE, WebSocket) on gateway_host:gateway_port;
                  --processes N: N of them sharing that port, supervised
runlog worker     a worker: takes run jobs, executes runs (--concurrency N)
runlog token      mint a bearer token for --user, signed with jwt_secret or
                  else the secret of --data-dir's `runlog up`
runlog issuers check  fetch each trusted issuer's JWKS, print its keys (exit 1
                  if one did not load)
runlog revoke     revoke every token of --user issued so far (ends its connections)
runlog prune      delete runs that ended more than --older-than-days ago
runlog settings   print every setting with its variable, flag and default
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from broker import errors, migrate
from broker.settings import Settings

from . import logformat

log = logging.getLogger("runlog")


# Under each command's --help: its options are its own; the settings are flags too.
_SETTINGS_EPILOG = (
    "Every setting is also a flag (--name-with-dashes VALUE) and a RUNLOG_<NAME> "
    "environment variable: `runlog settings` lists them with their defaults."
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="runlog", description="Durable event log for AI agent runs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = functools.partial(sub.add_parser, epilog=_SETTINGS_EPILOG)

    up = command("up", help="run the embedded stack (NATS, PostgreSQL, worker, gateway)")
    up.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    up.add_argument(
        "--gateways", type=int, default=1,
        help="gateway processes, on consecutive ports from gateway_port (default 1)",
    )  # fmt: skip
    Settings.add_arguments(up)

    mig = command("migrate", help="apply pending migrations")
    Settings.add_arguments(mig)

    gw = command("gateway", help="run a gateway (REST, SSE, WebSocket)")
    gw.add_argument(
        "--processes", type=int, default=None,
        help="gateway processes sharing gateway_port, supervised by this one (gateway_processes)",
    )  # fmt: skip
    Settings.add_arguments(gw)

    wk = command("worker", help="run a worker (executes runs; SIGTERM drains it)")
    wk.add_argument(
        "--concurrency", type=int, default=None, help="most runs at once (worker_concurrency)"
    )
    Settings.add_arguments(wk)

    tok = command(
        "token",
        help="mint a bearer token (jwt_secret, else the secret `runlog up` keeps in --data-dir)",
    )
    tok.add_argument("--user", required=True, help="the user id (the token's subject)")
    tok.add_argument("--ttl-s", type=float, default=None, help="lifetime in seconds")
    Settings.add_arguments(tok)

    rv = command("revoke", help="revoke every token of a user issued so far; its connections end")
    rv.add_argument("--user", required=True, help="the user id (the tokens' subject)")
    Settings.add_arguments(rv)

    tail = command("tail", help="print a run's events live, readably")
    tail.add_argument("run_id")
    tail.add_argument("--after", type=int, default=0, help="start after this seq (default 0)")
    tail.add_argument(
        "--url", action="append", default=None,
        help="gateway URL (repeat for failover; default: public_url or gateway_host:port)",
    )  # fmt: skip
    tail.add_argument("--token", default=None, help="bearer token (default: $RUNLOG_TOKEN)")
    tail.add_argument(
        "--user",
        default=None,
        help="mint a token for this user (jwt_secret, else --data-dir's `runlog up` secret)",
    )
    Settings.add_arguments(tail)

    pr = command(
        "prune", help="delete ended runs older than a cutoff, with their events and approvals"
    )
    pr.add_argument(
        "--older-than-days", type=float, required=True,
        help="delete runs that ended more than this many days ago",
    )  # fmt: skip
    pr.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
    pr.add_argument(
        "--batch-events", type=int, default=None,
        help="most events deleted per transaction (default 50000; runs are kept whole)",
    )  # fmt: skip
    Settings.add_arguments(pr)

    iss = command("issuers", help="check the trusted token issuers (trusted_issuers)")
    iss.add_argument("action", choices=["check"], help="check: fetch each JWKS, print its keys")
    Settings.add_arguments(iss)

    st = command("settings", help="print every setting (variable, flag, default)")
    st.add_argument("--markdown", action="store_true", help="as the table of docs/configuration.md")
    return p


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except BrokenPipeError:
        # The reader went away (`runlog settings | head`): end quietly, as a
        # shell reports SIGPIPE; stdout's last flush at exit must not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)


def _main(argv: list[str] | None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "settings":
        if args.markdown:
            from broker.settings import markdown

            print(markdown(), end="")
        else:
            _print_settings()
        return
    logged = False  # whether errors go through the configured log (json) or print
    try:
        _check_utf8(sys.argv[1:] if argv is None else argv)
        if getattr(args, "user", None) == "":
            raise errors.ClientError("--user must not be empty")
        settings = Settings.from_args(args)
        _check_data_dir(settings)
        if args.command in ("migrate", "revoke", "tail", "prune", "worker", "gateway"):
            from . import stack

            settings = stack.fill(settings)  # the URLs of a `runlog up` on its data folder
        if args.command in ("up", "worker") and settings.agent:
            sys.path.insert(0, os.getcwd())  # `--agent myagent:agent` from the folder it is in
        logformat.configure(settings.log_level, settings.log_format)
        logged = settings.log_format == "json"
        _check_database_url(settings)
        if args.command == "migrate":
            asyncio.run(_migrate(settings))
        elif args.command == "gateway":
            from gateway import main as gateway_main

            _need_urls(settings)
            processes = settings.gateway_processes if args.processes is None else args.processes
            if processes != 1:
                from . import group

                sys.exit(asyncio.run(group.run(settings, processes)))
            asyncio.run(gateway_main.run(settings))
        elif args.command == "worker":
            if args.concurrency is not None and args.concurrency < 1:
                raise errors.ClientError(f"--concurrency must be 1 or more, not {args.concurrency}")
            _check_agent(settings)
            asyncio.run(_worker(settings, args.concurrency))
        elif args.command == "tail":
            from . import tail as tail_mod

            token = args.token or os.environ.get("RUNLOG_TOKEN")
            if token is None and args.user:
                token = _mint(settings, args.user, None)
            if not token:
                raise errors.Unauthorized("give --token, $RUNLOG_TOKEN or --user")
            from . import stack

            urls = args.url or stack.gateway_urls(settings)
            from .client import check_base_url

            for url in args.url or []:
                try:
                    check_base_url(url)
                except ValueError:
                    raise errors.ClientError(
                        f"--url {url!r} is not an http:// or https:// URL (http://host:port)"
                    ) from None
            _tail(tail_mod.tail(urls, token, args.run_id, args.after))
        elif args.command == "prune":
            _check_prune(args.older_than_days, args.batch_events)
            asyncio.run(_prune(settings, args.older_than_days, args.dry_run, args.batch_events))
        elif args.command == "token":
            print(_mint(settings, args.user, args.ttl_s))
        elif args.command == "issuers":
            from gateway import issuers

            if not asyncio.run(issuers.report(settings, print)):
                sys.exit(1)
        elif args.command == "revoke":
            asyncio.run(_revoke(settings, args.user))
        elif args.command == "up":
            from . import up

            if args.gateways < 1 or args.workers < 0:
                which = "--gateways must be 1" if args.gateways < 1 else "--workers must be 0"
                raise errors.ClientError(f"{which} or more")
            from . import stack

            running = stack.read(settings.data_dir)
            if running is not None:
                raise errors.ClientError(
                    f"a runlog up (pid {running.pid}) is running on {settings.data_dir} already",
                    hint="stop it (Ctrl-C), or give this one another --data-dir",
                )
            _check_agent(settings)
            from gateway import issuers

            issuers.check(settings)  # one line here, not gateways failing to start
            asyncio.run(up.run(settings, workers=args.workers, gateways=args.gateways))
    except errors.RunlogError as e:
        if logged:
            log.error("error [%s]: %s", e.code, e.detail, extra={"code": e.code, "hint": e.hint})
        else:
            print(f"runlog: error [{e.code}]: {e.detail}", file=sys.stderr)
            if e.hint:
                print(f"hint: {e.hint}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        pass
    except Exception:
        # A bug or an unforeseen failure: one record with its traceback (one
        # JSON line with log_format=json), not Python's bare dump on stderr.
        log.exception("runlog %s failed", args.command)
        sys.exit(1)


def _tail(follow: Coroutine[Any, Any, None]) -> None:
    """A refusal or an unreachable gateway: one line and exit code 2."""
    from .client import ClientError

    try:
        asyncio.run(follow)
    except ClientError as e:
        print(f"runlog: error [{e.code}]: {e.body.get('message', '')}", file=sys.stderr)
        sys.exit(2)
    except ConnectionError as e:
        print(f"runlog: error [unreachable]: {e}", file=sys.stderr)
        sys.exit(2)


async def _migrate(settings: Settings) -> None:
    if not settings.database_url:
        raise errors.ClientError(
            "RUNLOG_DATABASE_URL is not set", hint="`runlog up` runs an embedded PostgreSQL"
        )
    applied = await migrate.apply(settings.database_url)
    print(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")


async def _prune(
    settings: Settings, older_than_days: float, dry_run: bool, batch_events: int | None
) -> None:
    from broker import retention
    from broker.store import Store

    if not settings.database_url:
        raise errors.ClientError("RUNLOG_DATABASE_URL is not set")
    store = await Store.connect(settings.database_url, settings)
    try:
        report = await retention.prune(
            store,
            older_than_s=older_than_days * 86400.0,
            dry_run=dry_run,
            batch_events=batch_events or retention.BATCH_EVENTS,
        )
    finally:
        await store.close()
    print(report.describe())


async def _revoke(settings: Settings, user: str) -> None:
    """Record the revocation in PostgreSQL (what every gateway re-checks), then
    tell the gateways at once over NATS."""
    import datetime

    from broker import control
    from broker.bus import Bus
    from broker.store import Store
    from gateway import access

    _need_urls(settings)
    store = await Store.connect(settings.database_url, settings)
    try:
        not_before = await store.revoke_tokens(user, "runlog revoke")
    finally:
        await store.close()
    at = datetime.datetime.fromtimestamp(not_before, datetime.UTC).isoformat()
    print(f"revoked: tokens of user {user!r} issued before {at} are refused "
          f"(not_before {not_before:.0f})")  # fmt: skip
    sent = False
    try:
        bus = await Bus.connect(settings.nats_url, settings, name="runlog-revoke")
    except errors.BusUnavailable as e:
        print(f"runlog: warning: {e.detail}", file=sys.stderr)
    else:
        try:
            sent = await access.send(
                bus, control.TokensRevoked(user_id=user, not_before=not_before)
            )
        finally:
            await bus.close()
    if not sent:
        print(f"runlog: the gateways were not told at once; each applies it within "
              f"access_recheck_s ({settings.access_recheck_s:.0f} s)", file=sys.stderr)  # fmt: skip


def _check_agent(settings: Settings) -> None:
    """Refuse to start with an agent that cannot be loaded (BadAgent), rather
    than leave workers failing (and `runlog up` restarting them) in a loop."""
    if settings.agent:
        from workers.runner import load_agent

        load_agent(settings.agent)


async def _worker(settings: Settings, concurrency: int | None) -> None:
    from workers.serve import serve

    from .supervisor import install_stop_signals

    _need_urls(settings)
    stop = asyncio.Event()
    install_stop_signals(stop)
    await serve(settings, stop, concurrency=concurrency)


def _mint(settings: Settings, user: str, ttl_s: float | None) -> str:
    """A token signed like the gateways of this data folder's `runlog up` sign
    (its <data_dir>/jwt_secret), unless jwt_secret is set."""
    from gateway import auth

    from . import secret

    if ttl_s is not None and not ttl_s >= 1:  # also nan; `exp` would be `iat` or before
        raise errors.ClientError(f"a token must live at least 1 s; asked for {ttl_s} s")
    settings = secret.resolve(settings, create_missing=False)
    token = auth.mint(settings, user, ttl_s)
    if auth.secret_is_public(settings):
        print(
            f"runlog: note: signed with the public development secret (no RUNLOG_JWT_SECRET, no "
            f"{secret.path_of(settings.data_dir)}): only a loopback gateway running with it "
            "accepts this token",
            file=sys.stderr,
        )
    return token


def _check_utf8(argv: list[str]) -> None:
    # A byte that is not UTF-8 reaches Python as a lone surrogate: a user id or
    # run id no token, URL or PostgreSQL text can carry.
    for arg in argv:
        try:
            arg.encode()
        except UnicodeEncodeError:
            shown = arg.encode(errors="surrogateescape").decode(errors="replace")
            raise errors.ClientError(f"the argument {shown!r} is not UTF-8") from None
    for name, value in os.environ.items():
        if name.startswith("RUNLOG_"):
            try:
                value.encode()
            except UnicodeEncodeError:  # its value not shown: it may be a secret
                raise errors.ClientError(f"the variable {name} is not UTF-8") from None


def _check_data_dir(settings: Settings) -> None:
    if settings.data_dir.exists() and not settings.data_dir.is_dir():
        raise errors.InvalidSetting("data_dir", str(settings.data_dir), "is not a folder")


def _check_database_url(settings: Settings) -> None:
    """A URL asyncpg cannot parse, told before connecting (its scheme only:
    the rest may hold a password)."""
    url = settings.database_url
    if url and not url.startswith(("postgresql://", "postgres://")):
        scheme = url.partition("://")[0] if "://" in url else "(no scheme)"
        raise errors.InvalidSetting(
            "database_url", scheme, "is not postgresql:// (postgresql://user@host:port/db)"
        )
    # Each host's port (host1:5432,host2:5432), which asyncpg reads with int().
    hosts = url.partition("://")[2].partition("/")[0].partition("?")[0].rpartition("@")[2]
    for spec in hosts.split(",") if hosts else []:
        if spec.endswith("]") or ":" not in spec:
            continue  # no port: an IPv6 address in brackets, or the default port
        port = spec.rpartition(":")[2]
        if not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
            raise errors.InvalidSetting("database_url", port, "is not a port (1 to 65535)")


_MAX_DAYS = 365_000  # a thousand years (a cutoff before 4713 BC is past PostgreSQL's range)


def _check_prune(older_than_days: float, batch_events: int | None) -> None:
    # Before connecting (retention.prune refuses an age of 0 or less too, once
    # connected); nan, inf and over _MAX_DAYS reached PostgreSQL.
    if not (0 < older_than_days <= _MAX_DAYS):  # also nan
        raise errors.ClientError(
            f"--older-than-days must be more than 0 and at most {_MAX_DAYS}, not {older_than_days}"
        )
    if batch_events is not None and batch_events < 1:
        raise errors.ClientError(f"--batch-events must be 1 or more, not {batch_events}")


def _need_urls(settings: Settings) -> None:
    if not settings.database_url or not settings.nats_url:
        raise errors.ClientError(
            "RUNLOG_NATS_URL and RUNLOG_DATABASE_URL must be set",
            hint="`runlog up` runs the whole stack with embedded NATS and PostgreSQL",
        )


def _print_settings() -> None:
    for env, flag, default, doc in Settings.table():
        print(f"{env}\n  {flag}  (default: {default})\n  {doc}\n")


if __name__ == "__main__":
    main()
