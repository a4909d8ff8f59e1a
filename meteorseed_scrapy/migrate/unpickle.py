"""Reading scrapy-redis's pickled requests without letting a payload run code.

scrapy-redis stores ``request.to_dict()`` with ``pickle.dumps(protocol=-1)``. Such a dict
is made of plain values only (dicts, lists, tuples, str, bytes, numbers, None, booleans, sets),
which pickle protocols 2+ encode without naming any global at all. Everything a pickle can
*call* goes through :meth:`pickle.Unpickler.find_class` (REDUCE, NEWOBJ, INST, OBJ and
STACK_GLOBAL all resolve their callable there), so refusing every name there but two
constructors of plain containers means a payload can build data and nothing else.
Persistent ids are refused as well (the base class raises when ``persistent_load`` is absent).
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any

#: The only globals accepted: older pickle protocols build sets through these constructors
#: (protocol 2 names them by their Python 2 module, which the base class maps).
ALLOWED_GLOBALS = frozenset(
    (module, name) for module in ("builtins", "__builtin__") for name in ("set", "frozenset")
)
#: Larger payloads are refused before unpickling: a queued request is a few kB at most.
MAX_PAYLOAD_BYTES = 2 * 1024 * 1024


class RejectedPayload(ValueError):
    """A queue entry that cannot (or must not) be decoded; the message says why."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise RejectedPayload(
            f"pickle refers to {module}.{name}: only plain request data (dicts, lists, strings, "
            "bytes, numbers) is accepted, never classes or functions"
        )


def loads_request(payload: bytes) -> dict[str, Any]:
    """The request dict in a scrapy-redis queue entry (pickle, or JSON from a custom
    ``SCHEDULER_SERIALIZER``); raises :class:`RejectedPayload` with the reason."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise RejectedPayload(f"entry is larger than {MAX_PAYLOAD_BYTES} bytes")
    if payload[:1] == b"{":
        try:
            data = json.loads(payload)
        except ValueError as exc:
            raise RejectedPayload(f"entry is neither pickle nor valid JSON ({exc})") from None
    else:
        try:
            data = _PlainUnpickler(io.BytesIO(payload)).load()
        except RejectedPayload:
            raise
        except Exception as exc:  # any malformed pickle is just one rejected entry
            raise RejectedPayload(f"entry is not a readable pickle ({exc!r})"[:300]) from None
    if not isinstance(data, dict):
        raise RejectedPayload(f"entry holds a {type(data).__name__}, not a request dict")
    return data
