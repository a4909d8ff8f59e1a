"""Every use of a private part of aiohttp, behind one door.

Checked on aiohttp :data:`AIOHTTP_CHECKED_ON` (the floor in ``setup.cfg`` to the newest release
tried) by reading its source and by ``tests/test_aiohttp_internals.py``, which fails, naming the
missing part, on a release that lacks one. ``meteorseed serve`` checks them when its site
starts (:func:`check`): an error then, rather than a connection cap that silently stops working.

What is used, and why (aiohttp has no public view of a connection's state):

* ``RequestHandler._manager``: the handler's server, set to ``None`` once its connection is
  lost; the only mark of a lost connection that a handler not yet connected does not share
  (both have no ``transport``). The guarded site counts the connections it holds with it.
* ``RequestHandler._waiter``: the future a handler awaits exactly while no complete request
  head has come (a fresh connection, an idle keep-alive, headers trickling in): the connections
  the guarded site may close to make room for a new one.
* ``RequestHandler._request_count``: the request heads parsed on the connection; none yet, the
  guarded site closes it at its first-request deadline (aiohttp before 3.14.4 has none: its
  keep-alive deadline starts only once a response is sent).

Everything else the guarded site does is public: ``web.BaseSite`` (``start``/``stop``/``name``),
``BaseRunner.server`` as the protocol factory, ``RequestHandler.force_close``.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web

#: The aiohttp releases every use below was checked on: setup.cfg's floor, the newest tried.
AIOHTTP_CHECKED_ON = ("3.10.5", "3.14.5")
#: Set on every handler by its ``__init__``.
_HANDLER_ATTRIBUTES = ("_manager", "_request_count", "_waiter")


def missing(handler: web.RequestHandler) -> list[str]:
    """The private parts of aiohttp used here that ``handler`` (a fresh one) lacks."""
    return [f"RequestHandler.{name}" for name in _HANDLER_ATTRIBUTES
            if not hasattr(handler, name)]


def check(handler: web.RequestHandler) -> None:
    """Raise, naming what is missing, when ``handler`` lacks a part used here."""
    gone = missing(handler)
    if gone:
        raise RuntimeError(
            f"meteorseed serve needs {', '.join(gone)} of aiohttp (checked on aiohttp "
            f"{AIOHTTP_CHECKED_ON[0]} to {AIOHTTP_CHECKED_ON[1]}); aiohttp "
            f"{aiohttp.__version__} lacks {'it' if len(gone) == 1 else 'them'}")


def connection_lost(handler: web.RequestHandler) -> bool:
    """Whether ``handler``'s connection was lost (false for one not yet connected)."""
    return handler._manager is None


def requests_received(handler: web.RequestHandler) -> int:
    """The complete request heads received on ``handler``'s connection."""
    return handler._request_count


def awaits_request(handler: web.RequestHandler) -> bool:
    """Whether ``handler`` is waiting for a complete request head."""
    waiter = handler._waiter
    return waiter is not None and not waiter.done()


__all__ = ["AIOHTTP_CHECKED_ON", "awaits_request", "check", "connection_lost", "missing",
           "requests_received"]
