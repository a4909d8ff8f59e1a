"""Reading scrapy-redis's pickled requests without letting a payload run code or run away.

scrapy-redis stores ``request.to_dict()`` with ``pickle.dumps(protocol=-1)``. Such a dict
is made of plain values only (dicts, lists, tuples, str, bytes, numbers, None, booleans, sets),
which pickle protocols 2+ encode without naming any global at all. Everything a pickle can
*call* goes through :meth:`pickle.Unpickler.find_class` (REDUCE, NEWOBJ, INST, OBJ and
STACK_GLOBAL all resolve their callable there), so refusing every name there but two
constructors of plain containers means a payload can build data and nothing else.
Persistent ids are refused as well (the base class raises when ``persistent_load`` is absent).

Data alone can still cost too much, so every entry is bounded before and after unpickling:
its size (:data:`MAX_PAYLOAD_BYTES`); the opcodes read (:data:`MAX_OPCODES`: each builds at most
one object) and memo indexes (a ``LONG_BINPUT 2**31`` makes the C unpickler allocate its memo
for that index); then the decoded value as the conversion will see it, shared objects counted
once per reference (a "billion laughs" pickle nests ten references to one list in each list:
a few hundred bytes that JSON-encode to gigabytes): :data:`MAX_DEPTH`, :data:`MAX_VALUES`,
:data:`MAX_EXPANDED_BYTES`.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any

from meteorseed_scrapy.task.json_depth import REPEATED, loads_bounded
from meteorseed_scrapy.task.validation import TaskError

#: The only globals accepted: older pickle protocols build sets through these constructors
#: (protocol 2 names them by their Python 2 module, which the base class maps).
ALLOWED_GLOBALS = frozenset(
    (module, name) for module in ("builtins", "__builtin__") for name in ("set", "frozenset")
)
#: Larger entries are refused unread: a queued request is a few kB at most.
MAX_PAYLOAD_BYTES = 2 * 1024 * 1024
#: Opcodes of one pickle (a request dict takes a few hundred); also the largest memo index.
MAX_OPCODES = 100_000
#: Deepest nesting of a decoded entry (a request dict with its meta needs a handful).
MAX_DEPTH = 50
TOO_DEEP = f"entry is nested deeper than {MAX_DEPTH} levels"
#: Values reached walking a decoded entry, a shared one once per reference.
MAX_VALUES = 100_000
#: Bytes of text, bytes and integers reached walking a decoded entry, counted as for MAX_VALUES.
MAX_EXPANDED_BYTES = 4 * MAX_PAYLOAD_BYTES
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


class RejectedPayload(ValueError):
    """A queue entry that cannot (or must not) be decoded; the message says why."""


def json_rejection(error: TaskError) -> str:
    """Why an entry whose JSON :func:`loads_bounded` refused is rejected: a key twice in one
    object (named), or nesting deeper than its limit, so than ours (the same on any Python)."""
    return f"entry: {error}" if error.problem == REPEATED else TOO_DEEP


def _shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for a reason: control characters escaped by repr, clipped."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise RejectedPayload(
            f"pickle refers to {_shown(f'{module}.{name}')}: only plain request data (dicts, "
            "lists, strings, bytes, numbers) is accepted, never classes or functions"
        )


def _scan(payload: bytes) -> None:
    """Refuse a pickle that would build too many objects or a huge memo, before loading it."""
    try:
        for count, (opcode, arg, _) in enumerate(pickletools.genops(payload), 1):
            if count > MAX_OPCODES:
                raise RejectedPayload(f"pickle has more than {MAX_OPCODES} opcodes")
            if opcode.name in _MEMO_PUTS and isinstance(arg, int) and arg > MAX_OPCODES:
                raise RejectedPayload(f"pickle memo index {arg} is out of bounds")
    except RejectedPayload:
        raise
    except Exception as exc:  # truncated, unknown opcode, bad argument: one rejected entry
        raise RejectedPayload(f"entry is not a readable pickle ({exc})"[:300]) from None


def check_shape(value: Any) -> None:
    """Raise :class:`RejectedPayload` unless ``value``, walked as JSON encoding would walk it
    (shared objects once per reference), stays within the depth, value and byte bounds."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    values = size = 0
    while stack:
        item, depth = stack.pop()
        values += 1
        children: Any = ()
        if isinstance(item, (str, bytes, bytearray)):
            size += len(item)
        elif isinstance(item, int):
            size += item.bit_length() // 8
        elif isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = item
        if size > MAX_EXPANDED_BYTES:
            raise RejectedPayload(f"entry expands to more than {MAX_EXPANDED_BYTES} bytes")
        if not children:
            continue
        if depth >= MAX_DEPTH:
            raise RejectedPayload(TOO_DEEP)
        # Everything on the stack will be visited: refuse now rather than hold it all.
        if values + len(stack) + len(children) > MAX_VALUES:
            raise RejectedPayload(f"entry expands to more than {MAX_VALUES} values")
        stack.extend((child, depth + 1) for child in children)


def loads_request(payload: bytes) -> dict[str, Any]:
    """The request dict in a scrapy-redis queue entry (pickle, or JSON from a custom
    ``SCHEDULER_SERIALIZER``); raises :class:`RejectedPayload` with the reason."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise RejectedPayload(f"entry is larger than {MAX_PAYLOAD_BYTES} bytes")
    if payload[:1] == b"{":
        try:
            data = loads_bounded("", payload)
        except TaskError as exc:  # a key twice, or deeper than json_depth's limit (so than ours)
            raise RejectedPayload(json_rejection(exc)) from None
        except ValueError as exc:
            raise RejectedPayload(f"entry is neither pickle nor valid JSON ({exc})"[:300]) from None
    else:
        _scan(payload)
        try:
            data = _PlainUnpickler(io.BytesIO(payload)).load()
        except RejectedPayload:
            raise
        except Exception as exc:  # any malformed pickle is just one rejected entry
            raise RejectedPayload(f"entry is not a readable pickle ({exc!r})"[:300]) from None
    if not isinstance(data, dict):
        raise RejectedPayload(f"entry holds a {type(data).__name__}, not a request dict")
    check_shape(data)
    return data
