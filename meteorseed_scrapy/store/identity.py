"""One namespace, one store: the store a namespace's items go to is recorded, and a worker
configured with another is refused at its start, as one with another shard count is.

Two workers of one namespace with different ``METEORSEED_STORE_URI`` (or one relative SQLite
path, ``sqlite:///items.db``, started from two directories) would split the items between two
stores without a word. The first worker records the store's identity in ``<ns>:store``: the URI
without credentials or options (``mongodb://host:port/db``, hosts sorted) or an SQLite file's
absolute path (``sqlite:////abs/items.db``). Only crawls whose items reach the store stage
(``UpsertPipeline`` in ``ITEM_PIPELINES``) record or check it. To move a namespace to another
store on purpose, stop its workers and delete ``<ns>:store``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy.utils.conf import build_component_list
from scrapy.utils.misc import load_object

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.settings import store_uri_from
from meteorseed_scrapy.store.sqlite import sqlite_path
from meteorseed_scrapy.validators import ConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

    from meteorseed_scrapy.queue.plumbing.connection import AsyncRedis


_STAGE = "meteorseed_scrapy.pipelines.UpsertPipeline"


def store_identity(uri: str) -> str:
    """What names the store of ``uri``, whatever the spelling: credentials and options left
    out, hosts sorted, an SQLite path made absolute (from this process's directory)."""
    scheme = uri.partition("://")[0].lower()
    if scheme == "sqlite":
        path = sqlite_path(uri)
        return "sqlite:///" + (path if path == ":memory:" else os.path.realpath(path))
    parts = urlsplit(uri)
    hosts = ",".join(sorted(parts.netloc.rpartition("@")[2].lower().split(",")))
    if scheme in ("postgresql", "postgres"):
        return f"postgresql://{hosts}/{parts.path.lstrip('/')}"
    from meteorseed_scrapy.store.mongo import database_name  # (SQLite users: no pymongo)

    return f"{scheme}://{hosts}/{database_name(uri)}"


def _stores_items(settings: BaseSettings) -> bool:
    for stage in build_component_list(settings.getwithbase("ITEM_PIPELINES")):
        cls = load_object(stage) if isinstance(stage, str) else stage
        if any(f"{c.__module__}.{c.__qualname__}" == _STAGE for c in getattr(cls, "__mro__", ())):
            return True
    return False


async def check_store_identity(client: AsyncRedis, keys: KeyLayout, settings: BaseSettings) -> None:
    """Record the namespace's store if none is, else refuse another (:class:`ConfigError`
    naming ``METEORSEED_STORE_URI``). Nothing to do for a crawl that stores no items here."""
    if not _stores_items(settings):
        return
    mine = store_identity(store_uri_from(settings))
    await client.set(keys.store, mine, nx=True)
    recorded = await client.get(keys.store)
    if isinstance(recorded, bytes):
        recorded = recorded.decode("utf-8", "replace")
    if recorded is not None and recorded != mine:
        raise ConfigError(
            "METEORSEED_STORE_URI",
            f"this worker's store is {mine}, but namespace {keys.namespace!r} writes its items "
            f"to {recorded}: the items would be split between two stores. Use the same store "
            f"(an SQLite path is relative to the worker's directory), or, to move the namespace "
            f"to another store on purpose, stop its workers and delete the key {keys.store!r}")


__all__ = ["check_store_identity", "store_identity"]
