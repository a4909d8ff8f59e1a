"""JSON from outside: nested no deeper than :data:`MAX_DEPTH` on every Python, and each key
once in its object.

How deep ``json.loads`` goes before a ``RecursionError`` depends on the Python (about 1,000
levels before 3.13, about 10,000 from 3.13 on), and a value that parses may still exhaust the
stack of whatever walks it next (``copy.deepcopy``, ``==``, a recursive helper). So a boundary
parses with :func:`loads_bounded`: deeper than :data:`MAX_DEPTH` is refused, with the path of
the first too-deep array or object in document order, whichever Python parses it. What a
refused text still names at its top level (the site of a dead letter) is read by
:func:`top_level_strings`, however deep the text nests.

A key twice in one object is refused too (:data:`REPEATED`, naming its path): ``json.loads``
keeps the last value and drops the first without a word, and which of the two a reader keeps
depends on the reader. A site's response is the exception (``unique=False``): a browser keeps
the last value, and so does a spider.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from itertools import chain
from typing import Any

from meteorseed_scrapy.task.validation import TaskError

#: Deepest nesting of arrays and objects taken from outside (a task, a seed, an API body, a
#: record in Redis): far below the recursion limit of the code that later copies, prints or
#: encodes the values (json, repr, deepcopy).
MAX_DEPTH = 64
TOO_DEEP = f"nests deeper than {MAX_DEPTH} levels"
#: Deepest nesting of a JSON response read by a site's rules (a thread of replies nests deep;
#: a task never holds more than the values its fields select): within what ``json.loads``
#: parses on every Python, even called from deep in Scrapy's stack.
MAX_RESPONSE_DEPTH = 512
REPEATED = "appears more than once in its object"
_KEY_SHOWN = 100
_PATH_SHOWN = 300
# A string (escapes included; an unterminated one runs to the end) or a structural character.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}:,]', re.DOTALL)
# The same, and a run of anything else (a number, true, false, null, junk) as one token.
_ANY_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}:,]|[^ \t\n\r\[\]{}:,"]+',
                        re.DOTALL)
# What top_level_strings expects next (a close may come after "[" or "{", not after ",").
_VALUE, _FIRST_VALUE, _KEY, _FIRST_KEY, _COLON, _NEXT = range(6)
_CLOSE = {"[": "]", "{": "}"}


def loads_bounded(name: str, text: str | bytes, limit: int = MAX_DEPTH, *,
                  unique: bool = True) -> Any:
    """``json.loads(text)``; a :class:`TaskError` naming the path (``name`` for the whole
    value; ``""``: a top-level key alone) when it nests deeper than ``limit``, even
    where ``json.loads`` gives up earlier (``RecursionError``) or the text breaks further on,
    or (``unique``) when an object holds a key twice. Nesting is checked first, as where
    ``json.loads`` gives up. Any other ``ValueError`` of ``json.loads`` is raised as is."""
    try:
        data = json.loads(text, object_pairs_hook=unique_object if unique else None)
    except (ValueError, RecursionError, RepeatedKey) as exc:
        shown = text if isinstance(text, str) else text.decode("utf-8", "replace")
        refused = refusal(name, shown, exc, limit)
        if refused is None:
            raise
        raise refused from None
    opened = (text.count("[") + text.count("{") if isinstance(text, str)
              else text.count(b"[") + text.count(b"{"))
    if opened > limit:  # (else it cannot nest deeper: most texts are not walked)
        check_depth(name, data, limit)
    return data


def refusal(name: str, text: str, error: BaseException, limit: int = MAX_DEPTH, *,
            fields: bool = False, whole: str | None = None) -> TaskError | None:
    """What ``json.loads``'s ``error`` on ``text`` (parsed with :func:`unique_object`) is
    refused as: nesting deeper than ``limit``, first, as where ``json.loads`` gives up, then a
    key twice in one object, each naming its path (``whole``, by default ``name`` or
    ``"value"``: the text itself); None for any other malformed JSON. With ``fields``, the
    text is an object of fields, each of which may nest ``limit`` levels (a task's, as
    :func:`~meteorseed_scrapy.task.exec_task.check_json_value` counts)."""
    levels = f"nests deeper than {limit} levels"
    path = deep_text_path(name, text, limit + 1 if fields else limit, error)
    if path is not None:
        return TaskError(_shown(path), levels)
    if isinstance(error, RecursionError):  # (the scan finds what the parser met)
        return TaskError(whole or name or "value", levels)
    if isinstance(error, RepeatedKey):
        return TaskError(repeated_key_path(name, text), REPEATED)
    return None


class RepeatedKey(Exception):
    """Raised inside ``json.loads`` by :func:`unique_object` (not a ``ValueError``: a handler
    of malformed JSON must not take it for one); :func:`repeated_key_path` names the key."""


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object, or :class:`RepeatedKey` when one of
    its keys comes twice."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise RepeatedKey
    return value


def repeated_key_path(name: str, text: str) -> str:
    """The path of the first key that comes twice in one object of ``text``, in document
    order (``name`` when none does)."""
    return _shown(_first_path(name, text, len(text), repeats=True) or name or "value")


def check_depth(name: str, value: Any, limit: int = MAX_DEPTH) -> None:
    """Refuse ``value`` (parsed JSON: plain dicts and lists) nesting deeper than ``limit``,
    naming the path as :func:`loads_bounded` does. Iterative, one pass per level."""
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):
        # (the fastest form measured: a response of a site's rules is walked once)
        level = [sub for sub in chain.from_iterable(
                     item.values() if type(item) is dict else item for item in level)
                 if type(sub) is dict or type(sub) is list]
        if not level:
            return
    raise TaskError(_shown(_deep_value_path(name, value, limit)),
                    f"nests deeper than {limit} levels")


def _shown(path: str) -> str:
    """``path``, its middle left out beyond 300 characters (the same on every Python)."""
    return path if len(path) <= _PATH_SHOWN else f"{path[:200]}…{path[-99:]}"


def _joined(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key[:_KEY_SHOWN]}" if path else key[:_KEY_SHOWN]


def _deep_value_path(name: str, value: Any, limit: int) -> str:
    """The path of the first array or object at depth ``limit``, in document order."""
    stack: list[tuple[str, Any, int]] = [(name, value, 0)]
    while stack:
        path, item, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        if depth >= limit:
            return path
        pairs = (((key if isinstance(key, str) else repr(key)), sub) for key, sub in item.items()
                 ) if isinstance(item, dict) else enumerate(item)  # (YAML keys: any scalar)
        stack.extend(reversed([(_joined(path, key), sub, depth + 1) for key, sub in pairs]))
    return name


def deep_text_path(name: str, text: str, limit: int = MAX_DEPTH,
                   error: BaseException | None = None) -> str | None:
    """The path of the first array or object opened at depth ``limit`` in ``text`` (JSON,
    possibly broken after that point), or None when none is. A scan of the text, for when
    ``json.loads`` failed (``error``: up to where it broke, as every Python's json would)."""
    end = error.pos + 1 if isinstance(error, json.JSONDecodeError) else len(text)
    return _first_path(name, text, end, limit=limit)


def _first_path(name: str, text: str, end: int, *, limit: int | None = None,
                repeats: bool = False) -> str | None:
    """A scan of ``text[:end]``: the path of the first array or object opened at depth
    ``limit``, or (``repeats``) of the first key met twice in one object; None when none is."""
    # [path, is_object, key or index, expecting a key, the object's keys so far]
    frames: list[list[Any]] = []
    for match in _TOKEN.finditer(text, 0, end):
        token = match.group()
        top = frames[-1] if frames else None
        if token in "[{":
            if limit is not None and len(frames) >= limit:
                return _child(name, top)
            frames.append([_child(name, top), token == "{", 0, token == "{", set()])
        elif token in "]}":
            if frames:
                frames.pop()
        elif top is None:
            continue
        elif token == ",":
            if top[1]:
                top[3] = True
            else:
                top[2] += 1
        elif token != ":" and top[1] and top[3]:
            key = _key(token)
            if repeats:
                if key in top[4]:
                    return _joined(top[0], key)
                top[4].add(key)
            top[2], top[3] = key, False
    return None


def _child(name: str, top: list[Any] | None) -> str:
    return name if top is None else _joined(top[0], top[2])


def _key(token: str) -> str:
    try:
        key = json.loads(token)
    except ValueError:
        return token.strip('"')
    return key if isinstance(key, str) else token


def top_level_strings(text: str, names: Collection[str]) -> dict[str, list[str | None]]:
    """The values of the keys ``names`` of the object ``text`` holds, each key's in order: a
    string's value, None for anything else (a number, an array, a string that is not valid
    JSON, a value broken off). However deep the text nests: one pass, in linear time, keys
    of nested objects ignored. The scan follows the JSON structure and stops at the first
    token out of place (after it, any key could be read at any depth); within strings and
    numbers only the values returned are checked. ``{}`` for a text that is not an object."""
    found: dict[str, list[str | None]] = {}
    stack: list[str] = []  # the closing character of each array and object open
    state, wanted = _VALUE, None  # (wanted: the top-level key whose value comes next)
    for match in _ANY_TOKEN.finditer(text):
        token = match.group()
        if state == _COLON:
            if token != ":":
                break
            state = _VALUE
        elif state == _NEXT:
            if token == "," and stack:
                state = _KEY if stack[-1] == "}" else _VALUE
            elif stack and token == stack[-1]:
                stack.pop()
            else:
                break  # (or text after the object, read whole by then)
        elif stack and token == stack[-1] and state in (_FIRST_KEY, _FIRST_VALUE):
            stack.pop()  # an empty array or object
            state = _NEXT
        elif state in (_KEY, _FIRST_KEY):
            if token[0] != '"':
                break
            key = _string(token) if len(stack) == 1 else None
            wanted = key if key in names else None
            if wanted is not None:
                found.setdefault(wanted, []).append(None)
            state = _COLON
        elif token in ("]", "}", ",", ":"):
            break
        else:  # a value, or the opening of one
            if wanted is not None:
                found[wanted][-1] = _string(token) if token[0] == '"' else None
                wanted = None
            if token == "[" and not stack:
                break  # (an array: no keys)
            close = _CLOSE.get(token)
            if close is None:
                state = _NEXT
            else:
                stack.append(close)
                state = _FIRST_KEY if close == "}" else _FIRST_VALUE
    return found


def _string(token: str) -> str | None:
    """The value of a string token, None when it is not a valid JSON string."""
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


__all__ = ["MAX_DEPTH", "MAX_RESPONSE_DEPTH", "REPEATED", "TOO_DEEP", "RepeatedKey",
           "check_depth", "deep_text_path", "loads_bounded", "refusal", "repeated_key_path",
           "top_level_strings", "unique_object"]
