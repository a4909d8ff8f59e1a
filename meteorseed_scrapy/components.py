"""Our components in Scrapy's component dicts (``ITEM_PIPELINES``, ``EXTENSIONS``,
``DOWNLOADER_MIDDLEWARES``…): added unless the project lists them itself, Scrapy's own switched
off unless the project lists them itself. A project names a component by import path or by
class, at any priority (None included): either way its entry stays as it wrote it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.utils.misc import load_object

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["add_component", "listed", "switch_off"]


def listed(settings: BaseSettings, name: str, path: str) -> bool:
    """The ``name`` component dict lists the component at ``path`` (by path or class)."""
    component = load_object(path)
    return any(load_object(key) is component for key in settings.getdict(name))


def add_component(settings: BaseSettings, name: str, path: str, order: int,
                  priority: str | None = None) -> None:
    """``path`` in the ``name`` component dict at ``order`` unless it is listed already
    (Scrapy's ``setdefault_in_component_priority_dict``). ``priority``: the dict's priority
    at least (a spider's ``update_settings`` adds at ``"spider"``, or ``scrapy crawl``, which
    merges the project's settings over a spider's, would drop what it added at a lower one)."""
    settings.setdefault_in_component_priority_dict(name, load_object(path), order)
    if priority is not None:  # (a no-op below the dict's priority: -s on the command line)
        settings.set(name, settings.getdict(name), priority=priority)


def switch_off(settings: BaseSettings, name: str, path: str) -> None:
    """Scrapy's component ``path`` off in the ``name`` component dict, unless the project
    lists it itself. Off by its import path, the key of Scrapy's ``*_BASE`` dicts: Scrapy 2.14
    does not let a class key (what ``setdefault_in_component_priority_dict`` writes) override
    a path key of the base, and kept the component on."""
    if not listed(settings, name, path):
        components = settings.getdict(name)
        components[path] = None
        settings.set(name, components, priority=settings.getpriority(name) or 0)
