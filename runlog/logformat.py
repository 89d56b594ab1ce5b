"""How every runlog process writes its log: one record per line, client values escaped.

Clients choose much of what reaches a log (a path, a header, a message, an
exception's text), so a record could otherwise carry a line feed and forge a
line, a carriage return or ANSI escape that rewrites a terminal, or a U+202E
that shows the rest reversed. The escaping lives here, in the formatter every
process installs (`configure`), not at the call sites: it covers `%s`
arguments, f-strings, and messages other libraries format themselves (aiohttp's
access log, asyncpg's and nats' errors), so no call site can forget it.

The rendered message is escaped, not the arguments alone, for the same reason:
a message built before the call has no arguments to escape. runlog's own
messages are one line by design, so nothing legitimate is lost.

Formats (`log_format`):
- `text`: `<time> <LEVEL> <logger>: <message>`. A traceback follows on the next
  lines, each indented by two spaces (and escaped too), so a line that starts
  at column 0 always starts a record.
- `json`: one JSON object per line (JSON lines): `ts`, `level`, `logger`,
  `message`, `exc_info` (the traceback, as one string) and any `extra=` fields.
  ASCII-only, so no line separator survives a pipeline that splits on them.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import sys
from typing import Any

from broker import errors

# C0 and C1 controls and DEL; Unicode line and paragraph separators; the bidi
# embedding, override and isolate controls; lone surrogates (a client's raw
# bytes, decoded with surrogateescape, would make the stream's encoder fail).
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    if c in _SHORT:
        return _SHORT[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def escape(text: str) -> str:
    """`text` with every control, line-separator, bidi and surrogate character
    written as a backslash escape (`\\n`, `\\x1b`, `\\u202e`): one line that
    displays as it is."""
    return _UNSAFE.sub(_escape_char, text) if _UNSAFE.search(text) else text


def _escape_lines(text: str) -> str:
    return "\n".join(escape(line) for line in text.split("\n"))


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        head, sep, rest = super().format(record).partition("\n")
        if not sep:
            return head
        # A traceback (or stack): indented, so it cannot pass for a record.
        return head + "".join("\n  " + escape(line) for line in rest.split("\n"))


# What every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": escape(record.getMessage()),
        }
        if record.exc_info:
            out["exc_info"] = _escape_lines(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc_info"] = _escape_lines(record.exc_text)
        if record.stack_info:
            out["stack_info"] = _escape_lines(self.formatStack(record.stack_info))
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out:
                out[key] = escape(value) if isinstance(value, str) else value
        # ensure_ascii: U+2028, NEL and the like leave as \u escapes too.
        return json.dumps(out, ensure_ascii=True, default=repr)


def formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return TextFormatter()
    raise errors.ClientError(f"log_format must be text or json, not {log_format!r}")


def configure(level: str, log_format: str) -> None:
    """Install the one stderr handler of this process (replacing any)."""
    if level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise errors.ClientError(f"log_level must be debug, info, warning or error, not {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for h in root.handlers[:]:
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
