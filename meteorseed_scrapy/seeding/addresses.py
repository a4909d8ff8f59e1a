"""Which addresses a server-side fetch may reach: public ones only, unless
``METEORSEED_FETCH_PRIVATE_ADDRESSES`` is true (Python's :mod:`ipaddress` decides what is
loopback, private, link-local, multicast, reserved or otherwise not global)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

PRIVATE_SETTING = "METEORSEED_FETCH_PRIVATE_ADDRESSES"
#: Request meta key (value :data:`PUBLIC_ONLY`) of tasks that came through the API: workers
#: fetch them, and their redirects, only from public addresses (address_policy.py).
POLICY_META_KEY = "address_policy"
PUBLIC_ONLY = "public"
#: NAT64's well-known prefix: its addresses stand for IPv4 ones (64:ff9b::a00:1 is 10.0.0.1).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressError(Exception):
    """A host that cannot be resolved, or resolves to an address that may not be reached."""


def plain_address(ip: _IP) -> _IP:
    """``ip``, or the IPv4 address an IPv4-mapped IPv6 one stands for (``::ffff:127.0.0.1`` is
    127.0.0.1): so read on every Python, where 3.13's ``ipaddress`` reads it so and older ones
    do not (``is_loopback``, ``str``)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def shown_address(host: str, ip: _IP) -> str:
    """``host`` for a message, with the address it stands for when that reads otherwise."""
    plain = str(plain_address(ip))
    return host if host == plain else f"{host} ({plain})"


def address_problem(ip: _IP) -> str | None:
    """Why ``ip`` is not a public address, or None when it is."""
    ip = plain_address(ip)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.sixtofour or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None)
        if embedded is not None and (problem := address_problem(embedded)):
            return problem
    for kind, flagged in (("a loopback", ip.is_loopback), ("a link-local", ip.is_link_local),
                          ("a multicast", ip.is_multicast), ("an unspecified", ip.is_unspecified),
                          ("a private", ip.is_private), ("a reserved", ip.is_reserved)):
        if flagged:
            return f"{kind} address"
    return None if ip.is_global else "not a global address"


def literal_problem(url: str, private_addresses: bool = False) -> str | None:
    """Why ``url`` may not be fetched because its host is a literal non-public address (no DNS
    involved: cheap enough to check while validating a request), or None."""
    if private_addresses:
        return None
    try:
        host = urlsplit(url).hostname or ""
        ip = ipaddress.ip_address(host)
    except ValueError:  # not a literal address (or not a URL: the fetch says so)
        return None
    problem = address_problem(ip)
    return None if problem is None else _refusal(host, ip, problem)


def resolve(host: str, port: int, private_addresses: bool = False) -> list[tuple[str, int]]:
    """The addresses to connect to for ``host``; each one is checked, and one refused address
    refuses the host (a name that also points inward is not fetched)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise AddressError(f"cannot resolve {host!r} ({exc})") from None
    out: list[tuple[str, int]] = []
    for _family, _kind, _proto, _name, sockaddr in infos:
        text = str(sockaddr[0])
        ip = ipaddress.ip_address(text.split("%", 1)[0])
        if not private_addresses and (problem := address_problem(ip)):
            raise AddressError(_refusal(host, ip, problem))
        if (text, port) not in out:
            out.append((text, port))
    if not out:
        raise AddressError(f"cannot resolve {host!r}")
    return out


def _refusal(host: str, ip: _IP, problem: str) -> str:
    shown = shown_address(host, ip)
    return (f"refused: {shown} is {problem}; set {PRIVATE_SETTING} to let server-side fetches "
            "reach such addresses")


__all__ = ["POLICY_META_KEY", "PRIVATE_SETTING", "PUBLIC_ONLY", "AddressError", "address_problem",
           "literal_problem", "plain_address", "resolve", "shown_address"]
