"""Walking a namespace's keys with SCAN, never matching another namespace's."""

from __future__ import annotations

import re
from collections.abc import Iterator

import redis

from meteorseed_scrapy.queue.keys import KeyLayout


def glob_escape(text: str) -> str:
    """``text`` with SCAN glob characters escaped, so that a namespace such as ``a*`` can
    never match (and ``reset`` never delete) another namespace's keys."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def scan_namespace(client: redis.Redis, keys: KeyLayout, suffix: str = "*",
                   count: int = 1000) -> Iterator[str]:
    """Every key ``<ns>:<suffix>`` (``suffix`` is a glob); checks the prefix of each one too."""
    prefix = f"{keys.namespace}:"
    for key in client.scan_iter(match=glob_escape(prefix) + suffix, count=count):
        if key.startswith(prefix):
            yield key
