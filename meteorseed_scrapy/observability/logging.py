"""Task ids on log lines, and JSON lines when ``METEORSEED_LOG_JSON`` is set.

:class:`TaskContextFilter` gives every record ``seed_id`` and ``task_id`` attributes (``None``
when unknown). It takes them, in this order, from ``extra=`` passed by the caller, from the task
whose callback/items run now (:data:`~meteorseed_scrapy.task.context.CURRENT_SCRAPE`), or from the
request/response among a record's dict arguments (Scrapy's "Crawled …", "Scraped from …" and
"Dropped …" lines carry them). :class:`TracingExtension` installs it on the root logger's
handlers (Scrapy's root handler among them), and :class:`JsonFormatter` with them when
``METEORSEED_LOG_JSON`` is true.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals

from meteorseed_scrapy.scrapy_internals import RootHandlerHook
from meteorseed_scrapy.settings import flag_setting
from meteorseed_scrapy.task.context import current_scrape, task_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

# What every record has, so not an ``extra=`` field (python-json-logger keeps a list like it).
RECORD_FIELDS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "taskName"}


def task_ids(record: logging.LogRecord) -> tuple[str | None, str | None]:
    """``(seed_id, task_id)`` of the task a record is about, or ``(None, None)``."""
    scrape = current_scrape()
    if scrape is not None:
        return scrape.task.seed_id, scrape.task.task_id
    args = record.args
    if isinstance(args, dict):
        for key in ("request", "response", "failure"):
            task = task_of(args[key]) if key in args else None
            if task is not None:
                return task.seed_id, task.task_id
    return None, None


class TaskContextFilter(logging.Filter):
    """Adds ``seed_id``/``task_id`` to every record; never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = record.__dict__
        if fields.get("task_id") is None:
            seed_id, task_id = task_ids(record)
            fields["task_id"] = task_id
            if fields.get("seed_id") is None:
                fields["seed_id"] = seed_id
        elif "seed_id" not in fields:
            fields["seed_id"] = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, then every
    ``extra=`` field that is not ``None`` (the task's ``seed_id``/``task_id`` when known,
    ``site_id``, ``url``, ``consumer``...; Scrapy's ``spider`` by its name, any other value
    that JSON lacks by ``str``; never over the first four), and ``exc_info`` as ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
            .isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in RECORD_FIELDS and value is not None:
                doc.setdefault(name, getattr(value, "name", value) if name == "spider" else value)
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def install(handlers: list[logging.Handler], json_lines: bool) -> int:
    """Puts the filter (and the JSON formatter) on ``handlers``; returns how many changed."""
    changed = 0
    for handler in handlers:
        if not any(isinstance(f, TaskContextFilter) for f in handler.filters):
            handler.addFilter(TaskContextFilter())
            changed += 1
        if json_lines and not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(JsonFormatter())
    return changed


class TracingExtension:
    """Always on (the add-on enables it): task ids on log records, JSON lines on request.

    Scrapy installs a new root handler when a crawler is created and again right after the
    extensions are built (``Crawler.crawl``); :class:`LogSetupMiddleware`, the first downloader
    middleware built after that (before anything is crawled), installs again, and so does
    ``spider_opened`` in case a handler came later.
    Only Scrapy's start-up banner, written before any project code runs, stays plain text.
    """

    def __init__(self, json_lines: bool) -> None:
        self.json_lines = json_lines

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> TracingExtension:
        ext = cls(flag_setting(crawler.settings, "METEORSEED_LOG_JSON"))
        ext.install()
        crawler.signals.connect(ext.install, signals.spider_opened)
        return ext

    def install(self) -> None:
        install(list(logging.getLogger().handlers), self.json_lines)


class LogSetupMiddleware(RootHandlerHook):
    """Not a middleware at all: the first downloader middleware built (order 0) installs the
    filter/formatter on the root handler Scrapy has just replaced, then bows out
    (:class:`~meteorseed_scrapy.scrapy_internals.RootHandlerHook`)."""

    @classmethod
    def on_root_handler(cls, crawler: Crawler) -> None:
        install(list(logging.getLogger().handlers),
                flag_setting(crawler.settings, "METEORSEED_LOG_JSON"))
