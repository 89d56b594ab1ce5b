"""`python -m bench <scenario> [--trials N] [--out DIR] [...]`.

Each scenario is a module `bench/<scenario>.py` with
`add_arguments(parser)` for its own flags and `async def run(args) -> dict`,
which returns {"figures": [Figure, ...], ...anything else worth keeping}.
This module adds the common flags, runs the scenario on the chosen event
loop, prints the figures as a table and writes everything, with the machine
description, to `<out>/<scenario>-<UTC timestamp>.json`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import sys
import time
from pathlib import Path
from types import ModuleType

from . import _lib

SCENARIOS = (
    "append", "fanout", "latency", "replay", "idle", "worker", "flood", "compat", "agents",
    "console", "peers", "cores", "scale",
)  # fmt: skip


def _load(name: str) -> ModuleType:
    return importlib.import_module(f"bench.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="runlog benchmarks against a real NATS and PostgreSQL "
        "(started in a temp folder unless RUNLOG_NATS_URL / RUNLOG_DATABASE_URL are set).",
    )
    sub = parser.add_subparsers(dest="scenario", required=True, metavar="scenario")
    for name in SCENARIOS:
        mod = _load(name)
        doc = (mod.__doc__ or name).strip().splitlines()[0]
        p = sub.add_parser(name, help=doc, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        p.add_argument("--trials", type=int, default=3, help="repetitions (default: 3)")
        p.add_argument(
            "--out",
            type=Path,
            default=Path("bench/results"),
            help="folder for the JSON result (default: bench/results)",
        )
        p.add_argument(
            "--uvloop", action="store_true", help="run on uvloop instead of the stdlib loop"
        )
        p.add_argument(
            "--work-dir",
            type=Path,
            default=None,
            help="folder for the servers' data (default: a temp folder, removed afterwards)",
        )
        mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    mod = _load(args.scenario)
    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    result = _lib.run_loop(mod.run(args), args.uvloop)
    elapsed_s = time.perf_counter() - t0
    _lib.print_table(f"bench {args.scenario}", result["figures"], args.trials)
    doc = {
        "scenario": args.scenario,
        "started_utc": started.isoformat(timespec="seconds"),
        "elapsed_s": round(elapsed_s, 1),
        "argv": sys.argv,
        "args": {k: v for k, v in vars(args).items() if k != "scenario"},
        "machine": _lib.machine_info("uvloop" if args.uvloop else "asyncio"),
        **result,
    }
    path = _lib.write_result(args.out, args.scenario, doc)
    print(f"wrote {path} ({elapsed_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
