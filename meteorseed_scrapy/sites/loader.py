"""The site rule files of ``METEORSEED_SITES_DIR``, loaded and kept current (hot reload).

One file per site: ``*.yaml``, ``*.yml`` or ``*.json``; with a ``remote``
(:class:`~meteorseed_scrapy.sites.remote.RemoteRules`), also the rule files pushed to Redis.
:meth:`SiteRegistry.poll` is the blocking half (stat every file, read and validate only those
whose mtime or size changed; one GET for the pushed rules) and runs in a thread;
:meth:`SiteRegistry.apply` is the cheap half and runs on the reactor thread, so the spider never
sees a half-applied change. A file that fails to parse or validate never replaces a good
version: the site keeps its last good config and the log says so.
"""

from __future__ import annotations

import logging
import zlib
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.sites.rulefile import SUFFIXES, FileResult, Source, Stamp, load_file
from meteorseed_scrapy.validators import ConfigError as SettingError

if TYPE_CHECKING:  # (importlib.resources.abc is Python 3.11+; only annotations use it)
    from importlib.resources.abc import Traversable

logger = logging.getLogger(__name__)

#: ``METEORSEED_SITES_DIR = "pkg://<package>/<dir>"``: rule files shipped as package data, read
#: with importlib.resources, so they load from a zipped egg too (as scrapyd runs a project).
PACKAGE_PREFIX = "pkg://"


def rules_dir(value: str | Path) -> Path | Traversable:
    """The rules directory a setting names: a path, or package data (:data:`PACKAGE_PREFIX`);
    a package that cannot be imported is an error naming the setting."""
    text = str(value)
    if not text.startswith(PACKAGE_PREFIX):
        return Path(value)
    package, _, sub = text[len(PACKAGE_PREFIX):].partition("/")
    try:
        root = resources.files(package)
    except (ImportError, TypeError, ValueError) as exc:
        raise SettingError("METEORSEED_SITES_DIR", f"{text!r}: cannot import package "
                           f"{package!r} ({exc})") from None
    parts = [part for part in sub.split("/") if part]
    return root.joinpath(*parts) if parts else root


def _source(path: Path | Traversable) -> Source:
    """How a rule file is named in stamps and logs: its path, or ``pkg://<path in the
    archive>`` for package data in a zip (whose objects are new on every listing)."""
    if isinstance(path, Path):
        return path
    return PACKAGE_PREFIX + str(getattr(path, "at", "") or path.name)


def _stamp(path: Path | Traversable) -> Stamp:
    """(mtime_ns, size) of a file; (CRC-32, size) of package data in a zip (no mtime)."""
    if isinstance(path, Path):
        info = path.stat()
        return (info.st_mtime_ns, info.st_size)
    data = path.read_bytes()
    return (zlib.crc32(data), len(data))


class SiteRegistry:
    """Site configs by ``site_id``; reads happen on one thread, updates via :meth:`apply`."""

    def __init__(self, directory: str | Path | None,
                 remote: RemoteRules | None = None) -> None:
        self.directory = rules_dir(directory) if directory is not None else None
        self.remote = remote
        self._sites: dict[str, SiteConfig] = {}
        self._stamps: dict[Source, Stamp] = {}
        self._owner: dict[Source, str] = {}  # file -> site_id it defines (last good version)
        self.errors = 0
        self._remote_down = False

    def get(self, site_id: str) -> SiteConfig | None:
        return self._sites.get(site_id)

    @property
    def sites(self) -> dict[str, SiteConfig]:
        return dict(self._sites)

    def load(self) -> SiteRegistry:
        """Initial, synchronous load (before the crawl starts)."""
        self.apply(self.poll())
        return self

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()

    def poll(self) -> list[FileResult]:
        """Blocking: what changed in the directory (and Redis) since the last :meth:`apply`."""
        results = self._poll_files(self.directory) if self.directory is not None else []
        if self.remote is not None:
            results.extend(self._poll_remote(self.remote))
        return results

    def _poll_remote(self, remote: RemoteRules) -> list[FileResult]:
        try:
            results = remote.changes(self._stamps)
        except (RedisError, UnicodeDecodeError) as exc:  # also bytes written by hand, not UTF-8
            if not self._remote_down:
                logger.warning("Cannot read the site rules pushed to Redis (%s): %s; keeping"
                               " the %d sites loaded", remote.keys.sites, exc, len(self._sites))
            self._remote_down = True
            return []
        if self._remote_down:
            logger.info("Site rules in Redis (%s) readable again", remote.keys.sites)
        self._remote_down = False
        return results

    def _poll_files(self, directory: Path | Traversable) -> list[FileResult]:
        try:
            paths = sorted((p for p in directory.iterdir()
                            if Path(p.name).suffix in SUFFIXES), key=lambda p: p.name)
        except OSError as exc:
            logger.error("Cannot list site rules in %s (METEORSEED_SITES_DIR): %s; keeping the"
                         " %d sites loaded", directory, exc, len(self._sites))
            return []
        results = []
        seen: set[Source] = set()
        for path in paths:
            source = _source(path)
            seen.add(source)
            try:
                stamp = _stamp(path)
            except OSError:
                continue  # deleted between listing and stat: seen as gone next time
            if self._stamps.get(source) == stamp:
                continue
            try:
                results.append(FileResult(source, stamp, config=load_file(path, str(source))))
            except RuleError as exc:
                results.append(FileResult(source, stamp, error=exc))
        results.extend(FileResult(source, None) for source in self._stamps
                       if (isinstance(source, Path) or source.startswith(PACKAGE_PREFIX))
                       and source not in seen)
        return results

    def apply(self, results: list[FileResult]) -> None:
        for result in results:
            if result.stamp is None:
                self._stamps.pop(result.path, None)
                self._forget(result.path, "its file was deleted")
            elif result.error is not None:
                self._stamps[result.path] = result.stamp
                self._reject(result.path, str(result.error))
            elif result.config is not None:
                self._stamps[result.path] = result.stamp
                self._accept(result.path, result.config)

    def _accept(self, path: Source, config: SiteConfig) -> None:
        holder = next((p for p, s in self._owner.items() if s == config.site_id and p != path),
                      None)
        if holder is not None:
            self._reject(path, f"{path}: site_id: {config.site_id!r} is already defined in"
                         f" {holder}")
            return
        if self._owner.get(path) not in (None, config.site_id):
            self._forget(path, f"its file now defines {config.site_id!r}")
        previous = self._sites.get(config.site_id)
        self._sites[config.site_id] = config
        self._owner[path] = config.site_id
        if previous is None:
            logger.info("Loaded site %s version %s from %s", config.site_id, config.version, path)
        else:
            logger.info("Reloaded site %s: version %s (was %s) from %s", config.site_id,
                        config.version, previous.version, path)

    def _reject(self, path: Source, error: str) -> None:
        self.errors += 1
        site_id = self._owner.get(path)
        kept = self._sites.get(site_id) if site_id else None
        if kept is not None:
            logger.error("Invalid site rules, keeping the last good version %s of site %s: %s",
                         kept.version, kept.site_id, error)
        else:
            logger.error("Invalid site rules, file ignored: %s", error)

    def _forget(self, path: Source, why: str) -> None:
        site_id = self._owner.pop(path, None)
        if site_id is not None and self._sites.pop(site_id, None) is not None:
            logger.warning("Site %s removed: %s (%s)", site_id, why, path)
