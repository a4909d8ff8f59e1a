"""Site rule files shared by a fleet through Redis (``meteorseed sites push DIR``).

``<ns>:sites`` is a hash: site_id -> JSON ``{"source", "text", "version", "sha1",
"pushed_at"}``, where ``text`` is the rule file exactly as written (comments kept) and
``source`` its file name (its suffix says YAML or JSON). ``<ns>:sites:rev`` is bumped in the
same transaction as every change, so a worker's reload check costs one GET while nothing changed.

The push validates every file first and writes all or nothing. Workers with
``METEORSEED_SITES_REDIS = True`` load these rules next to their ``METEORSEED_SITES_DIR`` files
and reload them like files (:class:`~meteorseed_scrapy.sites.loader.SiteRegistry`): an entry
that does not validate on the worker (a newer format, a hand edit) never replaces the site's
last good version; a removed entry removes its site. Blocking redis-py calls: the registry
polls in a thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import sync_client
from meteorseed_scrapy.queue.plumbing.reads import Batch, Plan, call, run_sync
from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.rulefile import SUFFIXES, FileResult, Stamp, parse_text
from meteorseed_scrapy.task.json_depth import loads_bounded

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import SyncRedis

logger = logging.getLogger(__name__)
PREFIX = "redis:"  # registry keys of pushed rules: redis:<hash key>/<site_id>
_UNSET: Any = object()


@dataclass(frozen=True)
class Pushed:
    """One rule file as pushed: its validated config and the text it came from."""

    config: SiteConfig
    source: str  # file name
    text: str

    def record(self, now: datetime | None = None) -> str:
        stamp = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return json.dumps({"source": self.source, "text": self.text,
                           "version": self.config.version, "sha1": sha1(self.text),
                           "pushed_at": stamp})


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _stamp(text: str) -> tuple[int, int]:
    return (int(sha1(text)[:15], 16), len(text))


def collect(directory: Path) -> list[Pushed]:
    """Every rule file of ``directory``, validated; raises :class:`RuleError` listing every
    bad file (and site_ids defined twice), so nothing is pushed unless all are good."""
    if not directory.is_dir():
        raise RuleError(str(directory), "", "not a directory")
    found: list[Pushed] = []
    errors: list[str] = []
    owners: dict[str, Path] = {}
    for path in sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES):
        try:
            text = path.read_text(encoding="utf-8")
            config = parse_text(text, path.suffix, str(path))
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{path}: cannot read: {exc}")
            continue
        except RuleError as exc:
            errors.append(str(exc))
            continue
        if config.site_id in owners:
            errors.append(f"{path}: site_id: {config.site_id!r} is already defined in"
                          f" {owners[config.site_id]}")
            continue
        owners[config.site_id] = path
        found.append(Pushed(config, path.name, text))
    if errors:
        raise RuleError(str(directory), "", "nothing pushed:\n  " + "\n  ".join(errors))
    if not found:
        raise RuleError(str(directory), "", f"no rule files ({', '.join(SUFFIXES)})")
    return found


class RemoteRules:
    """The pushed rules of one namespace, read and written with a synchronous client."""

    def __init__(self, client: SyncRedis, keys: KeyLayout) -> None:
        self.client = client
        self.keys = keys
        self._rev: Any = _UNSET  # <ns>:sites:rev when last read

    @classmethod
    def from_url(cls, url: str, keys: KeyLayout) -> RemoteRules:
        client = sync_client(url, decode_responses=True, socket_connect_timeout=5,
                             socket_timeout=10)
        return cls(client, keys)

    def close(self) -> None:
        self.client.close()

    def key_of(self, site_id: str) -> str:
        return f"{PREFIX}{self.keys.sites}/{site_id}"

    # -- operators ------------------------------------------------------------------------

    def push(self, pushed: Iterable[Pushed], *, prune: bool = False) -> list[str]:
        """Store ``pushed`` in one transaction; with ``prune``, drop every other site.
        Returns the site_ids removed."""
        records: dict[Any, Any] = {p.config.site_id: p.record() for p in pushed}
        stored = {str(k) for k in self.client.hkeys(self.keys.sites)} if prune else set()
        removed = sorted(stored - set(records))
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.sites, mapping=records)
            if removed:
                pipe.hdel(self.keys.sites, *removed)
            pipe.incr(self.keys.sites_rev)
            pipe.execute()
        return removed

    def remove(self, site_ids: Iterable[str]) -> int:
        ids = list(site_ids)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.sites, *ids)
            pipe.incr(self.keys.sites_rev)
            deleted, _ = pipe.execute()
        return int(deleted)

    def entries(self) -> dict[str, dict[str, Any]]:
        """site_id -> its record (a record that is not JSON reads as ``{"error": ...}``)."""
        out: dict[str, dict[str, Any]] = {}
        for site_id, raw in sorted(self.client.hgetall(self.keys.sites).items()):
            try:
                record = loads_bounded("record", raw)
            except ValueError as exc:
                record = {"error": f"not JSON: {exc}"}
            out[str(site_id)] = record if isinstance(record, dict) else {"error": "not an object"}
        return out

    # -- workers ------------------------------------------------------------------------

    def changes(self, stamps: Mapping[Any, Stamp]) -> list[FileResult]:
        """Blocking: what changed since the registry's ``stamps`` (keyed like :meth:`key_of`):
        one GET while nothing did, else the whole hash, validated here (off the reactor)."""
        if self._rev is not _UNSET and self.client.get(self.keys.sites_rev) == self._rev:
            return []
        rev, raw = run_sync(self.client, _rules_plan(self.keys))
        if isinstance(raw, list):  # raw reply: a cluster MULTI skips parsing (redis-py 6.2)
            raw = dict(zip(raw[::2], raw[1::2], strict=True))
        results = []
        for site_id, value in raw.items():
            key = self.key_of(site_id)
            try:
                record = loads_bounded("record", value)
                text, source = record["text"], str(record["source"])
                if not isinstance(text, str):
                    raise TypeError("text is not a string")
            except (ValueError, KeyError, TypeError) as exc:
                stamp = _stamp(value)
                if stamps.get(key) != stamp:
                    error = RuleError(key, "", f"not a pushed rule record: {exc!r}")
                    results.append(FileResult(key, stamp, error=error))
                continue
            # The rule's text and file name, not the record: a push of the same rules a
            # second later (a new pushed_at) changes nothing.
            stamp = _stamp(f"{source}\0{text}")
            if stamps.get(key) == stamp:
                continue
            try:
                config = parse_text(text, Path(source).suffix, f"{key} ({source})")
                if config.site_id != site_id:
                    raise RuleError(key, "site_id", f"{config.site_id!r} stored as {site_id!r}")
                results.append(FileResult(key, stamp, config=config))
            except RuleError as exc:
                results.append(FileResult(key, stamp, error=exc))
        gone = [key for key in stamps if isinstance(key, str) and key.startswith(PREFIX)
                and key.rsplit("/", 1)[-1] not in raw]
        results.extend(FileResult(key, None) for key in gone)
        self._rev = rev  # only once all of it is read: a failed read is tried again
        return results


def _rules_plan(keys: KeyLayout) -> Plan[tuple[Any, Any]]:
    """The rules' revision and their hash, read at one instant (one MULTI)."""
    (replies,) = yield [Batch([call("get", keys.sites_rev), call("hgetall", keys.sites)],
                              transaction=True)]
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies[0], replies[1]
