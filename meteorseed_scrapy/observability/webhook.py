"""One signed webhook call: resolve the host and check every address, POST once, classify the
answer (docs/webhooks.md).

* **Signature.** ``X-MeteorSeed-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">``
  with the ``X-MeteorSeed-Timestamp`` sent along (epoch seconds): a receiver recomputes it over
  the exact bytes it got (:func:`verify`) and refuses an old timestamp, so a captured call
  cannot be replayed later. ``X-MeteorSeed-Delivery`` is the same for every attempt of one
  call (:func:`~meteorseed_scrapy.observability.notify.delivery_id`): calls come at least
  once, a receiver drops repeats by it.
* **Addresses.** The host is resolved here and each address checked against the fetch policy
  (:func:`~meteorseed_scrapy.seeding.addresses.address_problem`); the connection then goes to
  those addresses only (a pinned resolver: no second lookup a rebinding DNS server could answer
  differently). Redirects are not followed: a 3xx is a refusal, as its target was never checked.
* **Bounds.** One deadline per attempt (connect, send, answer), at most
  :data:`MAX_RESPONSE_BYTES` of the answer read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver

from meteorseed_scrapy.politeness.policy import parse_retry_after
from meteorseed_scrapy.seeding.addresses import address_problem, shown_address

if TYPE_CHECKING:  # (a TypedDict of aiohttp 3.10.6+: plain dicts are built at runtime)
    from aiohttp.abc import ResolveResult

SIGNATURE_HEADER = "X-MeteorSeed-Signature"
TIMESTAMP_HEADER = "X-MeteorSeed-Timestamp"
DELIVERY_HEADER = "X-MeteorSeed-Delivery"
PRIVATE_SETTING = "METEORSEED_NOTIFY_PRIVATE_ADDRESSES"
#: Bytes of an answer read (for the log line); the rest is not.
MAX_RESPONSE_BYTES = 4096
#: Statuses worth another attempt: the receiver is down, overloaded or asks to come back.
_RETRIED = frozenset({408, 425, 429})


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(secret: bytes, timestamp: str, body: bytes, signature: str,
           tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """What a receiver does: the signature matches and the timestamp is recent."""
    try:
        age = abs((time.time() if now is None else now) - float(timestamp))
    except ValueError:
        return False
    return age <= tolerance_s and hmac.compare_digest(sign(secret, timestamp, body), signature)


@dataclass(frozen=True)
class Attempt:
    """How one attempt went."""

    status: int | None  # the HTTP status; None: no answer
    retry: bool  # another attempt may go better
    reason: str
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class _Refused(Exception):
    pass


def literal_refusal(url: str, private_addresses: bool = False) -> str | None:
    """Why ``url``'s host, a literal address, may not be called, or None (names are resolved
    and checked when the call is made)."""
    if private_addresses:
        return None
    try:
        host = urlsplit(url).hostname or ""
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    problem = address_problem(ip)
    return None if problem is None else _refusal(host, ip, problem)


def _refusal(host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address, problem: str) -> str:
    return (f"refused: {shown_address(host, ip)} is {problem}; set {PRIVATE_SETTING} to let"
            " webhooks reach such addresses")


async def checked_addresses(host: str, port: int, private_addresses: bool
                            ) -> list[ResolveResult]:
    """``host``'s addresses, each allowed; :class:`_Refused` when one is not (a name that
    also points inward is refused), :class:`OSError` when it cannot be resolved."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[ResolveResult] = []
    for family, _kind, proto, _name, sockaddr in infos:
        text = str(sockaddr[0])
        ip = ipaddress.ip_address(text.split("%", 1)[0])
        if not private_addresses and (problem := address_problem(ip)):
            raise _Refused(_refusal(host, ip, problem))
        out.append({"hostname": host, "host": text, "port": port, "family": family,
                    "proto": proto, "flags": socket.AI_NUMERICHOST})
    if not out:
        raise OSError(f"cannot resolve {host!r}")
    return out


class _Pinned(AbstractResolver):
    """Answers with the addresses already checked, whatever is asked."""

    def __init__(self, addresses: list[ResolveResult]) -> None:
        self.addresses = addresses

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return self.addresses

    async def close(self) -> None:
        return None


async def post(url: str, body: bytes, headers: Mapping[str, str], *, timeout: float,
               private_addresses: bool = False) -> Attempt:
    """POST ``body`` to ``url`` once; never raises for what the network or receiver does."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError as exc:
        return Attempt(None, False, f"not a valid URL ({exc})")
    try:
        return await asyncio.wait_for(_attempt(url, host, port, body, headers,
                                               private_addresses), timeout)
    except _Refused as exc:
        return Attempt(None, False, str(exc))
    except asyncio.TimeoutError:  # (not TimeoutError itself before Python 3.11)
        return Attempt(None, True, f"no answer within {timeout:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        return Attempt(None, True, f"{type(exc).__name__}: {exc}"[:500])


async def _attempt(url: str, host: str, port: int, body: bytes, headers: Mapping[str, str],
                   private_addresses: bool) -> Attempt:
    addresses = await checked_addresses(host, port, private_addresses)
    connector = aiohttp.TCPConnector(resolver=_Pinned(addresses), use_dns_cache=False,
                                     force_close=True, limit=1)
    async with aiohttp.ClientSession(connector=connector) as session, session.post(
            url, data=body, headers=dict(headers), allow_redirects=False) as response:
        head = await response.content.read(MAX_RESPONSE_BYTES)
        return _classify(response, head)


def _classify(response: aiohttp.ClientResponse, head: bytes) -> Attempt:
    status = response.status
    said = head[:200].decode("utf-8", "replace").strip()
    reason = f"HTTP {status}" + (f": {said}" if said else "")
    if 200 <= status < 300:
        return Attempt(status, False, reason)
    if 300 <= status < 400:
        where = response.headers.get("Location", "")[:200]
        return Attempt(status, False, f"HTTP {status} to {where!r}: redirects are not followed "
                                      "(give the final URL)")
    if status >= 500 or status in _RETRIED:
        after = parse_retry_after(response.headers.get("Retry-After"),
                                  response.headers.get("Date"))
        return Attempt(status, True, reason, after)
    return Attempt(status, False, reason)


__all__ = ["DELIVERY_HEADER", "MAX_RESPONSE_BYTES", "PRIVATE_SETTING", "SIGNATURE_HEADER",
           "TIMESTAMP_HEADER", "Attempt", "checked_addresses", "literal_refusal", "post", "sign",
           "verify"]
