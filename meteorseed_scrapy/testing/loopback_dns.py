"""Name lookups that never leave the machine, for test runs.

A test that names a host meant not to exist (Scrapy's suite fetches
``http://thereisdefinetelynosuchdomain.com``) would otherwise send a DNS query to the system's
resolver, which is traffic that is not loopback. While :func:`resolve_loopback_only` is on, an
IP literal (the legacy IPv4 forms included) and the loopback names (``localhost``,
``*.localhost``, the Debian IPv6 ones) resolve as usual and any other name fails at once as an
unknown name does (``socket.gaierror``, ``EAI_NONAME``), so the code under test sees the error
a missing domain gives.

The lookups are replaced in ``_socket`` as well as in ``socket``: ``socket.getaddrinfo`` calls
``_socket.getaddrinfo`` at call time, and Twisted's resolvers hold ``socket.getaddrinfo`` itself
from import time.
"""

from __future__ import annotations

import _socket
import ipaddress
import socket
from collections.abc import Callable
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "localhost6", "ip6-localhost", "ip6-loopback"})


def resolvable_here(host: str | bytes | None) -> bool:
    """``host`` needs no query to another machine: none (a wildcard bind), an IP literal, or a
    loopback name."""
    if host is None:
        return True
    if isinstance(host, str):
        try:
            host = host.encode("idna")  # (as socket's lookups encode a name: fullwidth digits)
        except UnicodeError:
            return True  # (the lookup itself fails so, before any query)
    name = host.decode("ascii", "replace").rstrip(".").lower()
    if not name or _loopback_name(name):
        return True
    try:
        ipaddress.ip_address(name.partition("%")[0])  # (an IPv6 scope: fe80::1%eth0)
    except ValueError:
        return _legacy_ipv4(name)
    return True


def _legacy_ipv4(name: str) -> bool:
    """``name`` is an IPv4 address in a form ``inet_aton`` reads (``127.1``, ``2130706433``,
    ``0x7f000001``), which ``getaddrinfo`` also answers without a query."""
    if any(c.isspace() for c in name):  # (inet_aton stops at a space; getaddrinfo does not)
        return False
    try:
        socket.inet_aton(name)
    except OSError:
        return False
    return True


def _loopback_name(name: str) -> bool:
    """``name`` (lower case, no final dot) is one the hosts file answers with loopback."""
    return name in LOOPBACK_NAMES or name.endswith(".localhost")


def reversible_here(address: str) -> bool:
    """A reverse lookup of ``address`` needs no query: a loopback address or name."""
    name = address.rstrip(".").lower()
    if _loopback_name(name):
        return True
    try:
        return ipaddress.ip_address(name.partition("%")[0]).is_loopback
    except ValueError:
        return False


def _refusal(host: object) -> str:
    return f"Name or service not known ({host!r}: a test run resolves loopback names only)"


def _guarded(lookup: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(host: str | bytes | None, *args: Any, **kwargs: Any) -> Any:
        if not resolvable_here(host):
            raise socket.gaierror(socket.EAI_NONAME, _refusal(host))
        return lookup(host, *args, **kwargs)

    guarded.__wrapped__ = lookup  # type: ignore[attr-defined]
    return guarded


def _guarded_hostbyaddr(lookup: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(address: str, *args: Any, **kwargs: Any) -> Any:
        if not reversible_here(str(address)):
            raise socket.herror(1, f"Unknown host ({_refusal(address)})")
        return lookup(address, *args, **kwargs)

    guarded.__wrapped__ = lookup  # type: ignore[attr-defined]
    return guarded


def _guarded_nameinfo(lookup: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(sockaddr: tuple[Any, ...], flags: int, *args: Any, **kwargs: Any) -> Any:
        if not (flags & socket.NI_NUMERICHOST or reversible_here(str(sockaddr[0]))):
            raise socket.gaierror(socket.EAI_NONAME, _refusal(sockaddr[0]))
        return lookup(sockaddr, flags, *args, **kwargs)

    guarded.__wrapped__ = lookup  # type: ignore[attr-defined]
    return guarded


#: Each lookup and its guard. The reverse ones (``socket.getfqdn``, ``HTTPServer.server_bind``)
#: answer a loopback address or name only, from the hosts file; any other fails as unknown.
_GUARDS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "getaddrinfo": _guarded, "gethostbyname": _guarded, "gethostbyname_ex": _guarded,
    "gethostbyaddr": _guarded_hostbyaddr, "getnameinfo": _guarded_nameinfo,
}


def resolve_loopback_only() -> Callable[[], None]:
    """Turn the guard on in this process; the function returned turns it off."""
    saved = [(module, name, getattr(module, name)) for module in (_socket, socket)
             for name in _GUARDS]
    for module, name, lookup in saved:
        if not hasattr(lookup, "__wrapped__"):
            setattr(module, name, _GUARDS[name](lookup))

    def restore() -> None:
        for module, name, lookup in saved:
            setattr(module, name, lookup)

    return restore
