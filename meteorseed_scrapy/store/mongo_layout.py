"""The collections of a namespace in a MongoDB database, and the move from the previous names.

The default namespace (``METEORSEED_NAMESPACE``'s default, ``meteorseed``) owns the plain names,
as the contract says: ``items``, ``anomalies``, ``sequences`` (the export's change order,
:mod:`.mongo_export`) and ``pages`` (the page cache, :mod:`.page_cache_mongo`). Any other
namespace ``<ns>`` owns ``<ns>.items``, ``<ns>.anomalies``, ``<ns>.sequences`` and
``<ns>.pages``. No two namespaces share a name: a kind has no dot, so a plain name is never
``<ns>.<kind>``, and ``<ns>.<kind>`` gives back its namespace (all before the last dot).

The previous version named the default namespace's collections ``meteorseed.<kind>``. When the
default namespace opens a kind (:func:`adopt_previous_names`) and ``meteorseed.<kind>`` holds
documents:

- ``<kind>`` is missing or holds none: ``meteorseed.<kind>`` is renamed ``<kind>`` (replacing
  the empty one), with a warning naming both;
- ``<kind>`` holds documents too (a worker of the previous version still writing, say): nothing
  is moved or merged; an error names both and says how to resolve it, and ``<kind>`` is used.

A rename another worker made first (the source gone, the target there) is not an error: opening
is idempotent, and workers may open at once. (Replacing an empty ``<kind>`` assumes no worker of
the previous version writes ``meteorseed.<kind>`` meanwhile: the README says to upgrade them
together.) No other namespace ever takes ``items``: before
namespaces every namespace wrote there, and those documents are now the default namespace's.
"""

from __future__ import annotations

import logging
from typing import Any

from pymongo.errors import OperationFailure

from meteorseed_scrapy.store.base import DEFAULT_NAMESPACE
from meteorseed_scrapy.validators import ConfigError

logger = logging.getLogger(__name__)

ITEMS = "items"
ANOMALIES = "anomalies"  # items that failed their site's validation (meteorseed_scrapy.sites)
SEQUENCES = "sequences"
PAGES = "pages"
#: renameCollection refused because another worker renamed first: the source is gone
#: (NamespaceNotFound; 10026 on mongomock-ng) or the target exists (NamespaceExists; 10027).
_RENAMED_BY_ANOTHER = frozenset({26, 48, 10026, 10027})


def collection_name(namespace: str, kind: str) -> str:
    """The name of ``namespace``'s collection of ``kind`` (:data:`ITEMS`, ...); a namespace
    MongoDB cannot name a collection after is a :class:`ConfigError` naming the setting."""
    if namespace == DEFAULT_NAMESPACE:
        return kind
    # MongoDB refuses '$' and NUL in a collection name and keeps 'system.' for itself.
    if namespace == "system" or namespace.startswith("system.") or any(
            c in namespace for c in "$\0"):
        raise ConfigError("METEORSEED_NAMESPACE",
                          f"namespace {namespace!r} cannot name a MongoDB collection (no '$', "
                          f"no NUL, not 'system' or 'system.*')")
    return f"{namespace}.{kind}"


def previous_name(kind: str) -> str:
    """What the previous version named the default namespace's collection of ``kind``."""
    return f"{DEFAULT_NAMESPACE}.{kind}"


def adopt_previous_names(database: Any, namespace: str, kinds: tuple[str, ...]) -> None:
    """Give the default namespace back its collections of ``kinds`` under their previous names
    (the module docstring); other namespaces have nothing to adopt."""
    if namespace != DEFAULT_NAMESPACE:
        return
    names = set(database.list_collection_names())
    for kind in kinds:
        old, new = previous_name(kind), collection_name(namespace, kind)
        if old in names:
            _adopt(database, old, new, new in names)


def _holds_documents(collection: Any) -> bool:
    return collection.find_one({}, {"_id": 1}) is not None


def _adopt(database: Any, old: str, new: str, new_exists: bool) -> None:
    # The target is read before the source: a worker that renamed in between leaves the source
    # empty (nothing to do), never the two full (a false alarm).
    new_full = new_exists and _holds_documents(database[new])
    if not _holds_documents(database[old]):
        return
    if new_full:
        logger.error(
            "MongoDB database %s: collections %s (named by the previous version) and %s both "
            "hold documents of the default namespace; using %s, leaving %s untouched. To "
            "resolve: stop the workers of the previous version, merge what %s holds into %s "
            "(e.g. db.getCollection(%r).aggregate([{$merge: {into: %r, whenMatched: "
            "'keepExisting'}}])), then drop %s", database.name, old, new, new, old, old, new,
            old, new, old)
        return
    try:
        database[old].rename(new, dropTarget=new_exists)
    except OperationFailure as exc:
        if exc.code not in _RENAMED_BY_ANOTHER:
            raise
        logger.debug("MongoDB: %s was renamed %s by another worker", old, new)
        return
    logger.warning("MongoDB database %s: collection %s (the default namespace's, as the "
                   "previous version named it) is now %s", database.name, old, new)


__all__ = ["ANOMALIES", "ITEMS", "PAGES", "SEQUENCES", "adopt_previous_names",
           "collection_name", "previous_name"]
