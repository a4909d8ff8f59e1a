"""The fault site's modes (what a site answers) and hits (what it received); see :mod:`.faults`."""

from __future__ import annotations

import html
from dataclasses import dataclass

RESET = 0  #: the status recorded for a connection closed without a response
MAX_DELAY = 600.0


@dataclass(frozen=True)
class Mode:
    status: int = 200  #: RESET for a connection reset
    delay: float = 0.0
    retry_after: str | None = None


@dataclass
class Hit:
    site: str
    target: str  #: path and query
    arrival: float  #: time.monotonic()
    arrival_wall: float  #: time.time()
    in_flight: int  #: requests to the site in flight at arrival, this one included
    finish: float | None = None
    finish_wall: float | None = None
    status: int | None = None  #: sent status, RESET (0) for a reset, None while in flight


@dataclass
class Temporary:
    """A mode that answers the next ``remaining`` requests, until ``until`` (monotonic); with
    ``lasts``, ``until`` is set when the first request meets it, ``lasts`` seconds later."""

    mode: Mode
    remaining: int | None
    until: float | None
    lasts: float | None = None


def parse_mode(mode: str | int = "ok", *, delay: float | None = None,
               retry_after: float | str | None = None) -> Mode:
    """``"ok"``, ``"slow"``, ``"reset"`` or a status code (``429``, ``"503"``) → :class:`Mode`."""
    text = str(mode).strip().lower()
    if text == "slow":
        status, delay = 200, 1.0 if delay is None else delay
    elif text in ("ok", "reset"):
        status = 200 if text == "ok" else RESET
    elif text.isdigit() and 200 <= int(text) <= 599:
        status = int(text)
    else:
        raise ValueError(f"unknown mode {mode!r}: ok, slow, reset or a status code 200-599")
    delay = 0.0 if delay is None else float(delay)
    if not 0 <= delay <= MAX_DELAY:
        raise ValueError(f"delay must be within 0-{MAX_DELAY:g} s, not {delay}")
    if retry_after is not None and status in (200, RESET):
        raise ValueError("retry_after goes with an error status")
    if isinstance(retry_after, float) and retry_after.is_integer():
        retry_after = int(retry_after)
    return Mode(status, delay, None if retry_after is None else str(retry_after))


def site_of(path: str) -> str:
    return path.strip("/").split("/", 1)[0]


def page(target: str, status: int) -> bytes:
    title = html.escape(f"Fault site {target}" if status == 200 else f"{status} {target}")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
            f"<body><h1>{title}</h1></body></html>\n").encode()


__all__ = ["MAX_DELAY", "RESET", "Hit", "Mode", "Temporary", "page", "parse_mode", "site_of"]
