"""One site rule file: read, parsed (YAML or JSON by its suffix) and validated.

Shared by the rules directory (:mod:`.loader`) and the rules pushed to Redis (:mod:`.remote`):
both hand the registry :class:`FileResult` values, so neither needs the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.schema import parse_site
from meteorseed_scrapy.sites.shown import shown
from meteorseed_scrapy.task.json_depth import check_depth, loads_bounded
from meteorseed_scrapy.task.validation import TaskError

if TYPE_CHECKING:  # (importlib.resources.abc is Python 3.11+; only annotations use it)
    from importlib.resources.abc import Traversable

SUFFIXES = (".yaml", ".yml", ".json")
#: A rule file larger than this is refused unread (the largest real one is a few kB).
MAX_FILE_BYTES = 1 << 20
#: Nodes a YAML rule file may have once its aliases are expanded.
MAX_NODES = 100_000
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
    error: RuleError | None = None


def load_file(path: Path | Traversable, source: str | None = None) -> SiteConfig:
    """Read and validate one rule file (a path, or package data: ``source`` names it), or
    raise :class:`RuleError`."""
    source = source or str(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)  # never more than the cap into memory
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(source, "", f"cannot read: {exc}") from None
    return parse_text(text, Path(path.name).suffix, source)


def parse_text(text: str, suffix: str, source: str) -> SiteConfig:
    """Validate the text of a rule file (``suffix`` ``.json``: JSON, else YAML)."""
    if len(text) > MAX_FILE_BYTES:
        raise RuleError(source, "", f"larger than {MAX_FILE_BYTES} bytes: not a rule file")
    kind = "JSON" if suffix == ".json" else "YAML"
    try:
        if suffix == ".json":
            data = loads_bounded("", text)
        else:
            data = yaml.load(text, _BoundedLoader)
            check_depth("", data)
    except TaskError as exc:  # nested too deeply: the same on every Python
        raise RuleError(source, exc.field, exc.problem) from None
    except ExpansionError as exc:
        raise RuleError(source, "", f"{kind}: {exc}") from None
    except (ValueError, RecursionError, yaml.YAMLError) as exc:  # also too deeply nested
        raise RuleError(source, "", f"not valid {kind}: {shown(str(exc))}") from None
    return parse_site(data, source)


class ExpansionError(ValueError):
    """A YAML document whose aliases expand beyond :data:`MAX_NODES`, or refer to themselves."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, refusing a document whose aliases expand it beyond
    :data:`MAX_NODES` nodes (an "anchor bomb": nine nested levels of ten aliases make a
    billion nodes out of a few hundred bytes, which every later walk over the value pays),
    and a key twice in one mapping (PyYAML keeps the last value and drops the first without
    a word; YAML itself forbids it). A merge (``<<: *base``) may still be overridden."""

    _root: yaml.Node | None = None

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node, {})
        self._root = node
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(
                    key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node)
            first = seen.setdefault(key, key_node)
            if first is not key_node:
                where = _where(first, key_node)
                raise TaskError(_path_of(self._root, node, key_node.value),
                                f"appears more than once in its mapping ({where})")
        return super().construct_mapping(node, deep)


def _where(first: yaml.Node, again: yaml.Node) -> str:
    one, two = first.start_mark, again.start_mark
    if one.line == two.line:
        return f"line {one.line + 1}, columns {one.column + 1} and {two.column + 1}"
    return f"lines {one.line + 1} and {two.line + 1}"


def _path_of(root: yaml.Node | None, mapping: yaml.MappingNode, key: str) -> str:
    """The path of ``key`` in ``mapping``, found from the document's ``root`` in document
    order (for an error only: one walk, each node once)."""
    stack: list[tuple[str, yaml.Node]] = [("", root)] if root is not None else []
    seen: set[int] = set()
    while stack:
        path, node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node is mapping:
            return f"{path}.{key}" if path else key
        if isinstance(node, yaml.MappingNode):
            stack.extend(reversed([(f"{path}.{k.value}" if path else str(k.value), v)
                                   for k, v in node.value]))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed([(f"{path}[{i}]", v) for i, v in enumerate(node.value)]))
    return key


def _expanded_size(node: yaml.Node, sizes: dict[int, int | None]) -> int:
    """Nodes in ``node`` with every alias expanded (shared nodes are weighed once: linear in
    the document, not in its expansion); :class:`ExpansionError` past the bound."""
    known = sizes.get(id(node), 0)
    if known is None:
        raise ExpansionError("an alias refers to a node that contains it")
    if known:
        return known
    sizes[id(node)] = None  # in progress: meeting it again is a cycle
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(key, sizes) + _expanded_size(value, sizes)
                    for key, value in node.value)
    if size > MAX_NODES:
        raise ExpansionError(f"aliases expand the document beyond {MAX_NODES} nodes")
    sizes[id(node)] = size
    return size


__all__ = ["MAX_FILE_BYTES", "MAX_NODES", "SUFFIXES", "ExpansionError", "FileResult", "Source",
           "Stamp", "load_file", "parse_text"]
