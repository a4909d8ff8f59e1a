"""What every ``meteorseed`` subcommand shares: where Redis is, output, confirmation, errors.

The CLI is a short-lived process that is not on a reactor, so it uses the synchronous redis-py
client. Errors that an operator can fix (Redis unreachable, a refused confirmation) end in one
line on stderr and a non-zero exit code, never a traceback.

Much of what the CLI prints was stored by others (URLs, reasons, consumer and site names):
:func:`printable` is the one escape for it. :class:`Context` writes through
:class:`TerminalStream`, so no path can send a raw ESC or bidi override to the terminal, and
table cells and single-line fields also escape their newlines.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, cast

from redis.exceptions import RedisError

from meteorseed_scrapy.exit_codes import EXIT_ERROR
from meteorseed_scrapy.queue.enqueue.dedup import Fingerprinter, settings_fingerprinter
from meteorseed_scrapy.queue.fleet.spiders import with_registered_sync
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import is_cluster_url, sync_client
from meteorseed_scrapy.queue.shards import stored_shards
from meteorseed_scrapy.scrapy_redis_settings import redact
from meteorseed_scrapy.settings import (
    DEFAULT_REDIS_URL,
    DEFAULTS,
    apply_environment,
    redis_url_from,
    stream_shards,
    text_setting,
    warn_unknown_settings,
)
from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis


class CliError(Exception):
    """An error reported as one line on stderr; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def _load_project_settings() -> Any | None:
    """The Scrapy project's settings when run inside one (a scrapy.cfg up the tree), else None;
    raises what a broken project raises."""
    from scrapy.utils.conf import closest_scrapy_cfg

    if not closest_scrapy_cfg():
        return None
    from scrapy.utils.project import get_project_settings

    return get_project_settings()


def _project_settings() -> Any | None:
    """:func:`_load_project_settings`, None for a broken project too."""
    try:
        return _load_project_settings()
    except Exception:  # a broken project must not keep an operator from looking at Redis
        return None


def project_fingerprinter(ctx: Context) -> Fingerprinter | None:
    """Inside a Scrapy project that sets its own ``REQUEST_FINGERPRINTER_CLASS``, that
    fingerprinter: a command that writes or looks up dedup records keys them as the project's
    workers do (queue/enqueue/dedup.py). None (canonical URLs) outside a project, for Scrapy's
    default,
    and, with a warning saying so, for a project whose settings or class cannot be loaded."""
    try:
        settings = _load_project_settings()
        return None if settings is None else settings_fingerprinter(settings)
    except Exception as exc:  # a broken project must not keep an operator from acting
        ctx.warn(f"cannot build the project's REQUEST_FINGERPRINTER_CLASS "
                 f"({str(exc)[:200]}); dedup keys: canonical URL")
        return None


def dedup_keys(fingerprinter: Fingerprinter | None) -> str:
    """Which dedup keys a command uses, for its startup line."""
    if fingerprinter is None:
        return "canonical URL"
    from scrapy.utils.python import global_object_name

    return f"REQUEST_FINGERPRINTER_CLASS {global_object_name(type(fingerprinter))}"


def cli_settings() -> Any:
    """The settings a command reads, resolved as a worker resolves them: the Scrapy project's
    (when run inside one; a broken project counts as none) with the environment's
    ``METEORSEED_*`` over them (:func:`~meteorseed_scrapy.settings.apply_environment`); a
    command's own options come first. Misspelt names are warned about on stderr, and an
    invalid value is a :class:`CliError` naming the setting."""
    from scrapy.settings import Settings

    from meteorseed_scrapy.setting_checks import check_settings

    settings = _project_settings()
    if settings is None:
        settings = Settings()
    apply_environment(settings)
    warn_unknown_settings(
        settings, lambda line: print(f"meteorseed: warning: {line}", file=sys.stderr))
    try:
        check_settings(settings)
    except ConfigError as exc:
        raise CliError(f"invalid setting {exc}") from None
    return settings


def resolve_target(redis_url: str | None, namespace: str | None) -> tuple[str, str]:
    """The Redis URL and namespace: the option, else :func:`cli_settings` (``METEORSEED_*``
    env, the project's settings, scrapy-redis's ``REDIS_*``, env ``REDIS_URL``, defaults)."""
    settings = cli_settings()
    url = redis_url or redis_url_from(settings)
    ns = namespace or text_setting(settings, "METEORSEED_NAMESPACE")
    return str(url), str(ns)


@dataclass
class Context:
    """What a subcommand runs with: a client, the key layout, how to print."""

    client: SyncRedis
    keys: KeyLayout
    url: str
    json: bool
    out: IO[str]
    err: IO[str]
    stdin: IO[str]

    def __post_init__(self) -> None:
        self.out, self.err = TerminalStream.of(self.out), TerminalStream.of(self.err)

    def emit_json(self, value: Any) -> None:
        text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False)
        # JSON escapes C0 controls itself; DEL, C1 and bidi controls become \u escapes here
        # (inside strings, the only place they can be), so the output stays valid JSON.
        self.out.write(_UNPRINTABLE_JSON.sub(_json_escape, text) + "\n")

    def say(self, line: str = "") -> None:
        print(line, file=self.out)

    def warn(self, line: str) -> None:
        print(f"meteorseed: {line}", file=self.err)

    def confirm(self, question: str, yes: bool) -> bool:
        """True when ``--yes`` was given or the operator answers y on a terminal.

        Raises :class:`CliError` when there is no terminal to ask on: a script must say
        ``--yes`` explicitly before it destroys anything.
        """
        if yes:
            return True
        if not self.stdin.isatty():
            raise CliError(f"{question} refused: not a terminal; pass --yes to confirm")
        self.err.write(f"{question} [y/N] ")
        self.err.flush()
        answer = self.stdin.readline().strip().lower()
        return answer in ("y", "yes")


def connect(url: str) -> SyncRedis:
    """A client whose first command fails fast (5 s) instead of hanging on a dead host; a
    ``redis.RedisCluster`` for a cluster URL."""
    try:
        client: SyncRedis = sync_client(
            url, decode_responses=True, socket_connect_timeout=5, socket_timeout=30
        )
    except ValueError as exc:  # a malformed URL
        raise CliError(f"invalid Redis URL {redact(url)!r}: {exc}") from None
    return client


def layout(client: SyncRedis, url: str, namespace: str) -> KeyLayout:
    """The namespace's key layout: the shard count its workers recorded (else env
    ``METEORSEED_STREAM_SHARDS``, else 1), tagged for a cluster URL."""
    try:
        keys = KeyLayout(namespace, stream_shards(cli_settings()), is_cluster_url(url))
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    try:  # (every spider's task set too: status, task lookups and dead letters see them all)
        return with_registered_sync(client, stored_shards(client, keys))
    except RedisError:  # unreachable: the command itself reports it
        return keys


def add_target_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url",
        help="Redis URL (default: env METEORSEED_REDIS_URL, the Scrapy project's "
        f"METEORSEED_REDIS_URL, env REDIS_URL, else {DEFAULT_REDIS_URL})",
    )
    parser.add_argument(
        "--namespace",
        help="key namespace (default: env METEORSEED_NAMESPACE, the project's setting, "
        f"else {DEFAULTS['METEORSEED_NAMESPACE']})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
          formats: Mapping[str, Callable[[Any], str]] | None = None) -> list[str]:
    """Rows as aligned text lines, a header first; numbers right-aligned."""
    formats = formats or {}
    cells = [[formats.get(c, _cell)(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), (int, float)) for row in rows) and bool(rows)
               for c in columns]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    for r in cells:
        parts = [v.rjust(w) if num else v.ljust(w)
                 for v, w, num in zip(r, widths, numeric, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return lines


def utc_time(value: object, missing: str = "-") -> str:
    """An epoch time in seconds as ``YYYY-MM-DD HH:MM:SS`` UTC; ``missing`` for anything else
    (None, or a field a record did not hold as a number)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return missing
    return dt.datetime.fromtimestamp(value, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    text = printable(str(value))
    return text if len(text) <= 60 else text[:57] + "..."


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` safe to show on a terminal: each character :meth:`str.isprintable` refuses
    (C0/C1 controls such as ESC, DEL, bidi overrides, line separators) as its Python escape
    (``\\x1b``, ``\\u202e``), so that a stored ``https://x/\\x1b[2J`` cannot clear or
    rewrite the operator's screen. ``newlines``: keep ``\\n`` (multi-line text such as a
    traceback); otherwise it is escaped too and the text stays on one line."""
    if text.isprintable():
        return text
    if newlines:
        return "\n".join(printable(line) for line in text.split("\n"))
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


class TerminalStream:
    """A text stream that writes everything through :func:`printable` (newlines kept)."""

    def __init__(self, raw: IO[str]) -> None:
        self.raw = raw

    @classmethod
    def of(cls, stream: IO[str]) -> IO[str]:
        # Typed as the stream it wraps: print(), logging and confirm() only write and flush.
        return stream if isinstance(stream, cls) else cast(IO[str], cls(stream))

    def write(self, text: str) -> int:
        return self.raw.write(printable(text, newlines=True))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding...
        return getattr(self.raw, name)


# What str.isprintable() refuses that json.dumps leaves raw (it escapes C0 and nothing else).
_UNPRINTABLE_JSON = re.compile(r"[^\n\x20-\x7e]")


def _json_escape(match: re.Match[str]) -> str:
    char = match.group()
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # a JSON escape outside the BMP is a UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
