"""The seed task: where data comes from and how often; ``seed-expand`` turns it into exec tasks.

Its completion webhook, ``notify`` (docs/webhooks.md), is checked where a seed enters (a seed
line, ``POST /dispatch``), with the field named (:func:`check_notify_url`): an http(s) URL with
a host, at most :data:`NOTIFY_URL_MAX` characters, no whitespace or control character, and no
user name or password (the URL is stored with the seed and shown by ``GET /seeds``: the
receiver authenticates a call by its signature instead). Whether its host's addresses may be
reached is decided when the call is made, resolved
(:mod:`meteorseed_scrapy.observability.notify`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.ids import fast_task_id
from meteorseed_scrapy.task.lanes import DEFAULT_LANE
from meteorseed_scrapy.task.validation import (
    TaskError,
    check_callback,
    check_id,
    check_json_safe,
    check_known_keys,
    check_lane,
    check_meta_keys,
    check_spider,
    check_url,
)

NOTIFY_FIELD = "notify"
NOTIFY_URL_MAX = 2048
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f-\x9f\s]")
TASK_TYPES = frozenset({"url_list", "url_template", "sitemap", "keywords"})

_json_str: Callable[[str], str] = json.encoder.encode_basestring

#: How the message JSON of an exec task made from a seed starts; the task id follows.
JSON_OPEN = '{"task_id":"'


@dataclass(frozen=True)
class ExecJson:
    """A seed's exec tasks as a template task and the pieces of their message JSON, which is
    ``JSON_OPEN + task_id + head + <URL as a JSON string> + closing(created_at)``: the same
    text as :meth:`ExecTask.to_message` encodes (tests/test_seed_fast_path.py compares)."""

    template: ExecTask  # the URL http://template.invalid/, the seed-level fields checked
    head: str
    tail: str  # the seed-level fields after the URL (leading comma), or ""

    def closing(self, created_at: float) -> str:
        return f'{self.tail},"created_at":{created_at!r}}}'


@dataclass(frozen=True)
class SeedTask:
    """Where data comes from and how often; ``seed-expand`` turns it into exec tasks."""

    seed_id: str
    site_id: str
    task_type: str
    payload: Mapping[str, Any]
    priority: int = 0
    schedule: Any = None
    parse_rule: str | None = None
    callback: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    lane: str = DEFAULT_LANE
    spider: str | None = None  # the spider whose workers take its tasks (None: any)
    notify: str | None = None  # completion webhook URL (check_notify_url)

    def __post_init__(self) -> None:
        check_id("seed_id", self.seed_id)
        check_id("site_id", self.site_id)
        if self.task_type not in TASK_TYPES:
            raise TaskError(
                "task_type", f"must be one of {sorted(TASK_TYPES)}, got {self.task_type!r}"
            )
        if not isinstance(self.payload, Mapping):
            raise TaskError("payload", "must be an object")
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise TaskError("priority", f"must be an integer, got {self.priority!r}")
        check_callback(self.callback)
        if self.parse_rule is not None and not isinstance(self.parse_rule, str):
            raise TaskError("parse_rule", "must be a string")
        if not isinstance(self.meta, Mapping):
            raise TaskError("meta", "must be an object")
        check_meta_keys(self.meta)  # seeds come from outside the crawl: no download controls
        check_json_safe("meta", dict(self.meta))
        check_lane(self.lane)
        check_spider(self.spider)
        check_notify_url(self.notify)

    @classmethod
    def from_dict(cls, data: Any) -> SeedTask:
        if not isinstance(data, dict):
            raise TaskError("seed", "must be a JSON object")
        for name in ("seed_id", "site_id", "task_type", "payload"):
            if name not in data:
                raise TaskError(name, "is missing")
        check_known_keys(data, cls.__dataclass_fields__, "", "a seed field")
        return cls(**data)

    def exec_json(self) -> ExecJson | None:
        """This seed's exec tasks with everything but the URL, task id and creation time
        validated once (see :class:`ExecJson`), or None when those seed-level fields do not
        validate (then use :meth:`exec_task`, whose errors name the problem)."""
        try:
            template = self.exec_task("http://template.invalid/")
        except ValueError:
            return None
        rest = {k: v for k, v in template.to_dict().items()
                if k not in ("task_id", "seed_id", "site_id", "url", "created_at")}
        middle = json.dumps(rest, separators=(",", ":"), ensure_ascii=False)[1:-1]
        return ExecJson(
            template,
            f'","seed_id":{_json_str(self.seed_id)},"site_id":{_json_str(self.site_id)},"url":',
            f",{middle}" if middle else "",
        )

    def exec_task_factory(self) -> Callable[[Any], ExecTask] | None:
        """A faster :meth:`exec_task` for many URLs of this seed, or None when the seed-level
        fields of its exec tasks do not validate (then use :meth:`exec_task`, whose errors name
        the problem).

        Everything but the URL, task id and creation time is validated once, here; per URL only
        the URL is checked (raising the same :class:`TaskError` as :meth:`exec_task`). Each
        task's message JSON is built from pieces encoded once and is identical to what
        :meth:`ExecTask.to_message` would encode.
        """
        parts = self.exec_json()
        if parts is None:
            return None
        # (its fields only: nothing the template cached, such as its canonical URL)
        fields = {name: value for name, value in parts.template.__dict__.items()
                  if name in ExecTask.__dataclass_fields__}
        head, tail = parts.head, parts.tail
        new_object = object.__new__
        now = time.time

        def make(url: Any) -> ExecTask:
            check_url(url)
            task_id = fast_task_id()
            created_at = round(now(), 3)
            task = new_object(ExecTask)
            values = task.__dict__
            values.update(fields)
            values["task_id"] = task_id
            values["url"] = url
            values["headers"] = dict(fields["headers"])
            values["meta"] = dict(fields["meta"])
            values["cb_kwargs"] = dict(fields["cb_kwargs"])
            values["created_at"] = created_at
            values["_json"] = (
                f'{JSON_OPEN}{task_id}{head}{_json_str(url)}{tail},"created_at":{created_at!r}}}'
            )
            return task

        return make

    def exec_task(self, url: str, **extra: Any) -> ExecTask:
        """An exec task for one URL of this seed (``url`` must already be validated)."""
        meta = dict(self.meta)
        if self.parse_rule:
            meta.setdefault("parse_rule", self.parse_rule)
        try:
            task = ExecTask.create(
                seed_id=self.seed_id,
                site_id=self.site_id,
                url=url,
                callback=self.callback,
                priority=self.priority,
                meta=meta,
                lane=self.lane,
                spider=self.spider,
                **extra,
            )
        except TaskError as exc:
            if exc.field == "url":
                check_url(url)  # refused in a seed's wording, as exec_task_factory's tasks are
            raise
        check_url(url)  # a seed's URLs are web URLs (a task's may also be data:)
        return task


def check_notify_url(value: Any, name: str = NOTIFY_FIELD) -> str | None:
    """``value`` when it is an acceptable webhook URL (or None: no webhook), else raise
    :class:`TaskError` naming ``name``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TaskError(name, f"must be an http(s) URL or null, got {type(value).__name__}")
    if len(value) > NOTIFY_URL_MAX:
        raise TaskError(name, f"is {len(value)} characters long, more than the limit of "
                              f"{NOTIFY_URL_MAX}")
    if (bad := _BAD_CHARS.search(value)) is not None:
        raise TaskError(name, f"holds a whitespace or control character ({bad.group()!r})")
    check_url(value, name)
    try:
        parts = urlsplit(value)
        host, _port = parts.hostname, parts.port  # (.port raises on a bad port)
    except ValueError as exc:
        raise TaskError(name, f"is not a valid URL ({exc})") from None
    if not host:
        raise TaskError(name, f"has no host: {value[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise TaskError(name, "must not hold a user name or password (it is stored with the "
                              "seed and shown; receivers check the call's signature)")
    return value


__all__ = ["JSON_OPEN", "NOTIFY_URL_MAX", "TASK_TYPES", "ExecJson", "SeedTask", "check_notify_url"]
