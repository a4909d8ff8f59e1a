"""One site rule file: read, parsed (YAML or JSON by its suffix) and validated.

Shared by the rules directory (:mod:`.loader`) and the rules pushed to Redis (:mod:`.remote`):
both hand the registry :class:`FileResult` values, so neither needs the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.reader import ConfigError
from meteorseed_scrapy.sites.schema import parse_site

if TYPE_CHECKING:  # (importlib.resources.abc is Python 3.11+; only annotations use it)
    from importlib.resources.abc import Traversable

SUFFIXES = (".yaml", ".yml", ".json")
Stamp = tuple[int, int]  # (mtime_ns, size); pushed rules: (digest prefix, size)
# A file; ``pkg://<package>/<dir>/<file>`` for package data; ``redis:<key>/<site_id>`` for a
# pushed rule file.
Source = Path | str


@dataclass(frozen=True)
class FileResult:
    """What one poll found for one source: a valid config, an error, or (stamp None) gone."""

    path: Source
    stamp: Stamp | None  # None: the file is gone
    config: SiteConfig | None = None
    error: ConfigError | None = None


def load_file(path: Path | Traversable, source: str | None = None) -> SiteConfig:
    """Read and validate one rule file (a path, or package data: ``source`` names it), or
    raise :class:`ConfigError`."""
    source = source or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"cannot read: {exc}") from None
    return parse_text(text, Path(path.name).suffix, source)


def parse_text(text: str, suffix: str, source: str) -> SiteConfig:
    """Validate the text of a rule file (``suffix`` ``.json``: JSON, else YAML)."""
    try:
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:  # also too deeply nested
        kind = "JSON" if suffix == ".json" else "YAML"
        raise ConfigError(source, "", f"not valid {kind}: {exc}") from None
    return parse_site(data, source)


__all__ = ["SUFFIXES", "FileResult", "Source", "Stamp", "load_file", "parse_text"]
