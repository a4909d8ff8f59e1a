"""Seeds (JSON Lines) to exec tasks, streaming: one line, one URL at a time, bounded memory.

Errors are data here, not exceptions that stop the run: a bad line is rejected with its line
number and reason, a bad URL inside a good line with its 0-based position in ``payload.urls``,
and everything else still goes to the stream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from meteorseed_scrapy.dedup.fingerprint import RECRAWL_META_KEY, check_recrawl_after
from meteorseed_scrapy.seeding.schedule import parse_schedule
from meteorseed_scrapy.seeding.sitemap import SitemapError, check_sitemap_payload, expand_sitemap
from meteorseed_scrapy.seeding.templates import (
    expand_keywords,
    expand_template,
    plan_keywords,
    plan_template,
)
from meteorseed_scrapy.tasks import ExecTask, SeedTask, TaskError, canonical_url

if TYPE_CHECKING:
    from meteorseed_scrapy.streams.writer import AddResult, Encoded, TaskWriter

logger = logging.getLogger(__name__)

#: canonical_url of the URLs just expanded: the check here and the fingerprint in
#: TaskWriter.encode then canonicalise each URL once (w3lib is the costliest step per URL).
cached_canonical_url = functools.lru_cache(maxsize=4096)(canonical_url)

#: Longest accepted seed line, in UTF-8 bytes, line ending excluded.
MAX_LINE_BYTES = 2 * 1024 * 1024
#: Most URLs accepted in one ``url_list`` seed line.
MAX_URLS_PER_LINE = 10_000
#: Longest accepted URL, in UTF-8 bytes.
MAX_URL_BYTES = 2048
#: URLs built between two yields to the event loop while a batch is in flight.
_YIELD_EVERY = 100
#: Event-loop steps given to a batch just handed to Redis (redis-py needs several to send it).
_YIELDS_AFTER_SEND = 10
SUPPORTED_TASK_TYPES = frozenset({"url_list", "url_template", "sitemap", "keywords"})

# json.loads turns "\ud800" escapes into lone surrogates, which UTF-8 (and so Redis keys and
# messages) cannot carry. Only lines holding such an escape pay for the full check.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class SeedLineError(ValueError):
    """A seed line that cannot be used at all; nothing of it is enqueued."""

    def __init__(self, lineno: int, reason: str) -> None:
        super().__init__(f"line {lineno}: {reason}")
        self.lineno = lineno
        self.reason = reason


class UnsupportedTaskType(TaskError):
    """A valid seed of a type this version cannot expand yet."""


@dataclass(frozen=True)
class UrlError:
    """A bad URL inside a good ``url_list`` line: ``position`` is its 0-based index in
    ``payload.urls``."""

    position: int
    reason: str


def check_payload(seed: SeedTask) -> None:
    """Check the type-specific payload and the ``schedule`` of ``seed``; raises
    :class:`TaskError`."""
    if seed.task_type not in SUPPORTED_TASK_TYPES:
        raise UnsupportedTaskType("task_type", f"{seed.task_type!r} is not supported")
    parse_schedule(seed.schedule)
    for where, holder in (("payload", seed.payload), ("meta", seed.meta)):
        if RECRAWL_META_KEY in holder:
            check_recrawl_after(holder[RECRAWL_META_KEY], f"{where}.{RECRAWL_META_KEY}")
    if seed.task_type == "url_template":
        plan_template(seed.payload)
        return
    if seed.task_type == "keywords":
        plan_keywords(seed.payload)
        return
    if seed.task_type == "sitemap":
        check_sitemap_payload(seed.payload)
        return
    urls = seed.payload.get("urls")
    if not isinstance(urls, list):
        raise TaskError("payload.urls", "must be a list of URLs")
    if len(urls) > MAX_URLS_PER_LINE:
        raise TaskError(
            "payload.urls",
            f"has {len(urls)} URLs, more than the limit of {MAX_URLS_PER_LINE} per line",
        )


def parse_seed_line(line: str | bytes, lineno: int) -> SeedTask:
    """Parse and validate one JSON Lines seed; raises :class:`SeedLineError` with the reason.

    ``bytes`` are checked against :data:`MAX_LINE_BYTES` before decoding (so a reader can hand
    over a cut-off prefix of an over-long line) and must be UTF-8.
    """
    if isinstance(line, bytes):
        raw = line
        if len(raw) > MAX_LINE_BYTES:
            raise SeedLineError(lineno, _too_long())
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SeedLineError(lineno, f"is not valid UTF-8 (byte {exc.start})") from None
    elif len(line) > MAX_LINE_BYTES // 4 and len(line.encode("utf-8", "replace")) > MAX_LINE_BYTES:
        # (a str of at most MAX/4 characters cannot exceed MAX bytes: skip the encode)
        raise SeedLineError(lineno, _too_long())
    try:
        data = json.loads(line)
    except RecursionError:
        raise SeedLineError(lineno, "is not valid JSON (nested too deeply)") from None
    except ValueError as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        column = f" at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise SeedLineError(lineno, f"is not valid JSON ({reason}{column})") from None
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise SeedLineError(
                lineno, "holds an unpaired surrogate escape (\\ud800-\\udfff)"
            ) from None
    try:
        seed = SeedTask.from_dict(data)
        check_payload(seed)
    except TaskError as exc:
        raise SeedLineError(lineno, str(exc)) from None
    except TypeError as exc:  # e.g. a list as task_type: unhashable, so no set lookup
        raise SeedLineError(lineno, f"is not a valid seed ({exc})") from None
    return seed


def _too_long() -> str:
    return f"is longer than the limit of {MAX_LINE_BYTES} bytes (2 MiB) per line"


def expand(seed: SeedTask) -> Iterator[ExecTask | UrlError]:
    """Exec tasks of ``seed``, one per URL, in order; a bad URL yields a :class:`UrlError`
    whose position counts URLs in expansion order (for ``url_list``: the index in
    ``payload.urls``; ``keywords``: in ``payload.keywords``; a failing child sitemap takes
    the position where its URLs would have been).

    The seed's payload is checked now (raising :class:`TaskError`), the URLs lazily, so a seed
    of a million URLs never exists as a million tasks at once. A sitemap that cannot be read
    raises :class:`SitemapError` while iterating.
    """
    check_payload(seed)
    if RECRAWL_META_KEY not in seed.meta and RECRAWL_META_KEY in seed.payload:
        # The window travels with each task (tasks.meta) to enqueue.lua, which stores it as
        # the site's window, so child requests (which carry none) inherit it.
        seed = SeedTask(**{**seed.__dict__, "meta": {
            **seed.meta, RECRAWL_META_KEY: seed.payload[RECRAWL_META_KEY]}})
    urls: Iterable[Any]
    if seed.task_type == "url_template":
        urls = expand_template(seed.payload)
    elif seed.task_type == "keywords":
        urls = expand_keywords(seed.payload)
    elif seed.task_type == "sitemap":
        urls = expand_sitemap(seed.payload)
    else:
        urls = seed.payload["urls"]
    return _expand_urls(seed, urls)


def _expand_urls(seed: SeedTask, urls: Iterable[Any]) -> Iterator[ExecTask | UrlError]:
    # Seed-level fields validated once, per URL only the URL (same errors as seed.exec_task).
    make_task = seed.exec_task_factory() or seed.exec_task
    for position, url in enumerate(urls):
        # Everything that could fail later in TaskWriter.add is checked here, per URL, so one
        # bad URL is rejected alone instead of failing a whole batch.
        if isinstance(url, (TaskError, SitemapError)):
            yield UrlError(position, str(url))
            continue
        if isinstance(url, str) and len(url) > MAX_URL_BYTES // 4 and (
            len(url.encode("utf-8", "replace")) > MAX_URL_BYTES
        ):
            yield UrlError(position, f"url: is longer than {MAX_URL_BYTES} bytes")
            continue
        try:
            task = make_task(url)  # validates the URL (any JSON value may come in)
            try:
                cached_canonical_url(task.url)  # a bad port or IPv6 host fails here
            except ValueError as exc:
                raise TaskError("url", f"cannot be canonicalised ({exc})") from None
            task.to_message()  # too large (seed meta + URL), or not encodable
        except ValueError as exc:  # TaskError included
            yield UrlError(position, str(exc))
            continue
        yield task


def read_lines(stream: IO[bytes], max_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Lines of a binary stream without their line ending, holding at most ~``max_bytes`` each.

    A longer line is yielded cut to more than ``max_bytes`` bytes (so :func:`parse_seed_line`
    rejects it and line numbers stay right) and the rest of it is skipped unread into memory.
    """
    limit = max_bytes + 2  # room for "\r\n" after a line of exactly max_bytes
    while True:
        chunk = stream.readline(limit)
        if not chunk:
            return
        if chunk.endswith(b"\n") or len(chunk) < limit:
            yield chunk.rstrip(b"\n").rstrip(b"\r")
            continue
        while True:  # over-long: drop the rest of the line
            rest = stream.readline(64 * 1024)
            if not rest or rest.endswith(b"\n"):
                break
        yield chunk


@dataclass(frozen=True)
class Rejection:
    """One rejected input: a whole line (``url_position`` None) or one URL of a line."""

    lineno: int
    reason: str
    url_position: int | None = None  # 0-based index in payload.urls

    def __str__(self) -> str:
        if self.url_position is None:
            return f"line {self.lineno}: {self.reason}"
        return f"line {self.lineno}, url {self.url_position}: {self.reason}"


@dataclass
class ExpandSummary:
    """Counts of one :func:`expand_stream` run (filled in as it goes)."""

    lines: int = 0
    expanded: int = 0  # valid tasks produced (sent, or counted by a dry run)
    enqueued: int = 0
    duplicates: int = 0
    bad_lines: int = 0
    bad_urls: int = 0

    @property
    def rejected(self) -> int:
        return self.bad_lines + self.bad_urls

    def __str__(self) -> str:
        return (
            f"read {self.lines} lines, enqueued {self.enqueued}, "
            f"duplicates {self.duplicates}, rejected {self.rejected}"
        )


async def expand_stream(
    lines: Iterable[str | bytes],
    writer: TaskWriter,
    *,
    batch_size: int = 500,
    on_error: Callable[[Rejection], None],
    max_backlog: int = 1_000_000,
    dedup: bool = True,
    on_wait: Callable[[int], None] | None = None,
    summary: ExpandSummary | None = None,
    dry_run: bool = False,
    on_batch: Callable[[ExpandSummary], None] | None = None,
    rejects: Callable[[str, str], str | None] | None = None,
) -> ExpandSummary:
    """Expand JSON Lines seeds into exec tasks and enqueue them in batches of ``batch_size``.

    Line numbers start at 1; blank lines are skipped (but counted as read). Before each batch
    the writer waits while the stream's backlog is above ``max_backlog``, calling ``on_wait``.
    Pass ``summary`` to keep the counts when Redis fails half-way (the exception propagates).
    ``dry_run`` expands, validates and counts (``summary.expanded``) but sends nothing to
    Redis. ``on_batch`` is called after each batch (progress reports). ``rejects(site_id,
    url)`` says why a URL may not be enqueued for its site (outside its allowed domains, on its
    blacklist: see :class:`~meteorseed_scrapy.api.rules.SiteRules`), or None.

    While Redis runs one batch's script, the next batch is built: one batch in flight at a
    time, so Python's work and Redis's overlap instead of adding up.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    summary = summary if summary is not None else ExpandSummary()
    batch: list[Encoded] = []
    in_flight: asyncio.Task[AddResult] | None = None
    # Tasks that may still be sent before the backlog must be looked at again: workers only
    # ever shrink it, so after a look showing room for N, N more cannot pass the limit. (One
    # look per batch was a round trip with Redis idle, for every 500 URLs.)
    room = 0

    async def settle() -> None:
        nonlocal in_flight
        if in_flight is not None:
            task, in_flight = in_flight, None
            result = await task
            summary.enqueued += result.enqueued
            summary.duplicates += result.duplicates

    async def flush() -> None:
        nonlocal in_flight, room
        if not batch:
            return
        summary.expanded += len(batch)
        if not dry_run:
            await settle()
            if room < len(batch):
                backlog = await writer.wait_for_room(max_backlog, on_wait or _ignore_wait)
                room = max_backlog - backlog
            room -= len(batch)
            in_flight = asyncio.ensure_future(writer.add_encoded(list(batch)))
            for _ in range(_YIELDS_AFTER_SEND):  # let it go out before building the next batch
                await asyncio.sleep(0)
        batch.clear()
        if on_batch is not None:
            on_batch(summary)

    try:
        for lineno, seed in parse_lines(lines, on_error, summary):
            try:
                for position, item in enumerate(expand(seed)):
                    if isinstance(item, UrlError):
                        summary.bad_urls += 1
                        on_error(Rejection(lineno, item.reason, item.position))
                        continue
                    reason = rejects(seed.site_id, item.url) if rejects is not None else None
                    if reason is not None:
                        summary.bad_urls += 1
                        on_error(Rejection(lineno, f"url: {reason}", position))
                        continue
                    try:
                        batch.append(writer.encode(item, dedup, cached_canonical_url(item.url)))
                    except TaskError as exc:  # (expand checked these; a guard, not a path)
                        summary.bad_urls += 1
                        on_error(Rejection(lineno, str(exc)))
                        continue
                    if len(batch) >= batch_size:
                        await flush()
                    elif in_flight is not None and len(batch) % _YIELD_EVERY == 0:
                        # Let the batch in flight go on (redis-py needs several event-loop
                        # steps to send it): sent early, Redis runs it while this one builds.
                        await asyncio.sleep(0)
            except SitemapError as exc:
                summary.bad_lines += 1
                on_error(Rejection(lineno, str(exc)))
        await flush()
    finally:
        await settle()
    logger.debug("expand_stream done: %s", summary)
    return summary


def parse_lines(lines: Iterable[str | bytes], on_error: Callable[[Rejection], None],
                summary: ExpandSummary) -> Iterator[tuple[int, SeedTask]]:
    """``(line number, seed)`` of each valid seed line; a bad line is reported to ``on_error``
    and counted in ``summary.bad_lines``, every line (blank ones too) in ``summary.lines``."""
    for lineno, line in enumerate(lines, start=1):
        summary.lines += 1
        if not line or line.isspace():  # (isspace: no copy of a 2 MiB line)
            continue
        try:
            seed = parse_seed_line(line, lineno)
        except SeedLineError as exc:
            summary.bad_lines += 1
            on_error(Rejection(lineno, exc.reason))
            continue
        yield lineno, seed


def _ignore_wait(backlog: int) -> None:
    pass
