"""Walking a namespace's keys with SCAN, never matching another namespace's: the namespace's
glob characters escaped, and each key checked to be the namespace's own (:func:`own_key`), not
one of a namespace nested in it (``prod:eu:…`` under ``prod``, as older versions allowed)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from meteorseed_scrapy.queue.keys import KeyLayout, own_key

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis


def glob_escape(text: str) -> str:
    """``text`` with SCAN glob characters escaped, so that a namespace such as ``a*`` can
    never match (and ``reset`` never delete) another namespace's keys."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def scan_prefix(client: SyncRedis, keys: KeyLayout, suffix: str = "*",
                count: int = 1000) -> Iterator[str]:
    """Every key ``<ns>:<suffix>`` (``suffix`` is a glob), the namespace's own or not."""
    prefix = f"{keys.namespace}:"
    for key in client.scan_iter(match=glob_escape(prefix) + suffix, count=count):
        if key.startswith(prefix):
            yield key


def scan_namespace(client: SyncRedis, keys: KeyLayout, suffix: str = "*",
                   count: int = 1000) -> Iterator[str]:
    """Every key ``<ns>:<suffix>`` of the namespace's own (``suffix`` is a glob)."""
    for key in scan_prefix(client, keys, suffix, count):
        if own_key(keys.namespace, key):
            yield key
