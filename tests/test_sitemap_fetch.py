"""Server-side sitemap fetches against a hostile web: no private addresses (first request and
every redirect hop, refused before any connection), no DNS rebinding between check and
connect, http(s) redirects only, the site's allowed domains, headers, User-Agent and robots.txt,
and one deadline for the whole fetch. Every site here is a local server on 127.0.0.1; other
addresses appear only as inputs that must be refused."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.seeding import addresses
from meteorseed_scrapy.seeding.addresses import PRIVATE_SETTING, address_problem, literal_problem
from meteorseed_scrapy.seeding.fetch import Fetcher, FetchError, FetchPolicy, read_all
from meteorseed_scrapy.seeding.seed_lines import parse_seed_line
from meteorseed_scrapy.seeding.seed_urls import UrlError, expand
from meteorseed_scrapy.seeding.sitemap import SitemapError, expand_sitemap
from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.sitemaps import SitemapHost, urlset

REFUSED_URLS = [
    "http://localhost:8000/sitemap.xml",  # a name that resolves to loopback
    "http://10.0.0.1/sitemap.xml",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/sitemap.xml",
    "http://[::ffff:127.0.0.1]/sitemap.xml",
    "http://[::ffff:10.0.0.1]:8080/sitemap.xml",
    "http://127.1/sitemap.xml",
    "http://2130706433/sitemap.xml",
    "http://0x7f000001/sitemap.xml",
    "http://0.0.0.0/sitemap.xml",
    "http://[::]/sitemap.xml",
    "http://[64:ff9b::a9fe:a9fe]/sitemap.xml",  # NAT64 for 169.254.169.254
    "http://[2002:a00:1::]/sitemap.xml",  # 6to4 for 10.0.0.1
    "http://[fe80::1]/sitemap.xml",
    "http://[fc00::1]/sitemap.xml",
    "http://224.0.0.1/sitemap.xml",
    "http://100.64.0.1/sitemap.xml",
    "http://192.168.1.1:443/sitemap.xml",
    "https://172.16.0.1/sitemap.xml",
    "http://240.0.0.1/sitemap.xml",
]


@contextlib.contextmanager
def no_connection() -> Iterator[None]:
    """Fails the test if anything tries to connect."""
    def refuse(address: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a connection to {address} was attempted")

    with mock.patch.object(socket, "create_connection", refuse):
        yield


@contextlib.contextmanager
def connections() -> Iterator[list[Any]]:
    """The addresses connected to, in order (the connections still happen)."""
    seen: list[Any] = []
    real = socket.create_connection

    def spy(address: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(address)
        return real(address, *args, **kwargs)

    with mock.patch.object(socket, "create_connection", spy):
        yield seen


@contextlib.contextmanager
def only_127_0_0_1_is_public() -> Iterator[None]:
    """Lets the checks run for real against the local test site: 127.0.0.1 counts as public,
    every other address (127.0.0.2, ::1, 10.x...) keeps its real verdict."""
    real = addresses.address_problem
    ours = ipaddress.ip_address("127.0.0.1")
    with mock.patch.object(addresses, "address_problem",
                           lambda ip: None if ip == ours else real(ip)):
        yield


@pytest.fixture
def site() -> Iterator[SitemapHost]:
    with SitemapHost() as host:
        yield host


def policy(**kwargs: Any) -> FetchPolicy:
    return FetchPolicy(**{"private_addresses": True, "robots": False, **kwargs})


def fetch(url: str, pol: FetchPolicy) -> bytes:
    with Fetcher(pol).open(url) as response:
        assert response.status == 200, response.status
        return read_all(response, 10**6)


def sitemap_seed(url: str, site_id: str = "shop") -> Any:
    return parse_seed_line(json.dumps({"seed_id": "map", "site_id": site_id,
                                       "task_type": "sitemap", "payload": {"url": url}}), 1)


# -- private addresses -------------------------------------------------------------------------

@pytest.mark.parametrize("url", REFUSED_URLS)
def test_private_addresses_are_refused_before_any_connection(url: str) -> None:
    with no_connection(), pytest.raises(SitemapError) as info:
        list(expand(sitemap_seed(url)))  # the default: METEORSEED_FETCH_PRIVATE_ADDRESSES off
    assert "refused" in str(info.value) and PRIVATE_SETTING in str(info.value)


def test_the_setting_lets_a_loopback_sitemap_through(site: SitemapHost) -> None:
    site.pages["/s.xml"] = urlset([f"{site.url}/p/1"])
    with pytest.raises(SitemapError, match="refused"):
        list(expand_sitemap({"url": f"{site.url}/s.xml"}))
    assert site.requests == []  # refused before connecting: the site saw nothing
    assert list(expand_sitemap({"url": f"{site.url}/s.xml"}, policy())) == [f"{site.url}/p/1"]


@settings(max_examples=200, deadline=None)
@given(st.ip_addresses().filter(lambda ip: not ip.is_global or ip.is_multicast))
def test_any_non_global_address_is_refused_before_connecting(
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    assert literal_problem(f"http://{host}/s.xml") is not None
    with no_connection(), pytest.raises(FetchError, match="refused"):
        Fetcher(FetchPolicy()).open(f"http://{host}:8080/s.xml")


@settings(max_examples=500, deadline=None)
@given(st.ip_addresses())
def test_address_problem_agrees_with_ipaddress(
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    problem = address_problem(ip)
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        assert problem == address_problem(mapped)
    elif problem is None:
        assert ip.is_global and not ip.is_multicast
    elif not ip.is_global or ip.is_multicast:
        assert problem


def test_a_redirect_to_a_private_address_is_refused_at_that_hop(site: SitemapHost) -> None:
    site.redirects["/a.xml"] = (301, "/b.xml")
    targets = ["http://10.0.0.1/s.xml", f"http://127.0.0.2:{site.port}/s.xml",
               f"http://[::1]:{site.port}/s.xml", "http://169.254.169.254/latest/"]
    for number, target in enumerate(targets):
        site.redirects["/b.xml"] = (302 + number % 2 * 5, target)
        with only_127_0_0_1_is_public(), connections() as seen, \
                pytest.raises(FetchError, match="refused") as info:
            fetch(f"{site.url}/a.xml", policy(private_addresses=False))
        assert PRIVATE_SETTING in str(info.value)
        assert seen == [("127.0.0.1", site.port)] * 2  # the two hops on the site, no third
    assert site.paths() == ["/a.xml", "/b.xml"] * len(targets)


def test_the_connection_goes_to_the_address_that_was_checked(site: SitemapHost) -> None:
    """A rebinding DNS server answers 127.0.0.1 (public, here) and then 10.0.0.1: only one
    lookup is made, and the connection goes to the address it gave."""
    site.pages["/s.xml"] = urlset(["https://shop.example/1"])
    answers = iter(["127.0.0.1", "10.0.0.1", "10.0.0.1"])
    lookups: list[str] = []
    real = socket.getaddrinfo

    def rebinding(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        return real(next(answers), port, *args, **kwargs)

    with only_127_0_0_1_is_public(), mock.patch.object(socket, "getaddrinfo", rebinding), \
            connections() as seen:
        body = fetch(f"http://rebind.test:{site.port}/s.xml", policy(private_addresses=False))
    assert b"shop.example/1" in body
    assert lookups == ["rebind.test"] and seen == [("127.0.0.1", site.port)]
    assert site.requests[0][1]["Host"] == f"rebind.test:{site.port}"


# -- redirects -------------------------------------------------------------------------------

@pytest.mark.parametrize("location", [
    "file:///etc/passwd", "gopher://127.0.0.1:6379/_INFO", "ftp://127.0.0.1/s.xml",
    "javascript:alert(1)", "data:text/xml,<urlset/>", "dict://127.0.0.1:11211/stats"])
def test_redirects_go_to_http_and_https_only(site: SitemapHost, location: str) -> None:
    site.redirects["/a.xml"] = (302, location)
    with pytest.raises(FetchError, match="only http and https"):
        fetch(f"{site.url}/a.xml", policy())


def test_relative_redirects_are_followed_and_loops_end(site: SitemapHost) -> None:
    site.redirects["/a.xml"] = (301, "b.xml")
    site.redirects["/b.xml"] = (308, f"{site.url}/c.xml")
    site.pages["/c.xml"] = b"<urlset/>"
    assert fetch(f"{site.url}/a.xml", policy()) == b"<urlset/>"
    site.redirects["/loop.xml"] = (302, "/loop.xml")
    with pytest.raises(FetchError, match="more than 5 redirects"):
        fetch(f"{site.url}/loop.xml", policy())
    site.redirects["/nowhere.xml"] = (302, "")
    with pytest.raises(FetchError, match="without a Location"):
        fetch(f"{site.url}/nowhere.xml", policy())


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(location=st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=60),
    st.sampled_from(["/ok.xml", "ok.xml", "//127.0.0.1/ok.xml", "http:/ok.xml", "http://",
                     "https://127.0.0.1:1/", "http://127.0.0.1:0/", "http://127.0.0.1:99999/",
                     "http://[::1/", "http://user:pw@127.0.0.1/ok.xml", "?x=1", "#frag",
                     "http://127.0.0.1.:1/", "HTTP://127.0.0.1/ok.xml", "/%00", "/.."]),
))
def test_any_location_either_leads_to_a_page_or_is_refused_with_a_reason(
        site: SitemapHost, location: str) -> None:
    site.pages["/ok.xml"] = b"<urlset/>"
    site.redirects["/r.xml"] = (302, location)
    looked_up: list[str] = []
    real = socket.getaddrinfo

    def local_only(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        if host != "127.0.0.1":  # nothing here may leave the machine, not even a DNS query
            raise socket.gaierror(socket.EAI_NONAME, "not a test host")
        return real(host, port, *args, **kwargs)

    pol = policy(private_addresses=False, allowed_domains=("127.0.0.1",))
    with only_127_0_0_1_is_public(), mock.patch.object(socket, "getaddrinfo", local_only), \
            connections() as seen:
        try:
            with Fetcher(pol).open(f"{site.url}/r.xml") as response:
                read_all(response, 10**6)
        except FetchError as exc:
            assert str(exc)
    assert all(address[0] == "127.0.0.1" for address in seen)
    # Only hosts inside the allowed domains are ever looked up (refused here unless exact).
    assert {host.rstrip(".") for host in looked_up} <= {"127.0.0.1"}


# -- the site's rules --------------------------------------------------------------------------

def shop(**kwargs: Any) -> SiteConfig:
    return SiteConfig(site_id="shop", version="1", source="test", **kwargs)


def test_a_sitemap_outside_the_allowed_domains_is_not_fetched(site: SitemapHost) -> None:
    pol = FetchPolicy.for_site("shop", shop(allowed_domains=("shop.example",)), True)
    with no_connection(), pytest.raises(SitemapError, match="not in the allowed domains"):
        list(expand(sitemap_seed(f"{site.url}/s.xml"), lambda site_id: pol))
    site.redirects["/away.xml"] = (302, "https://elsewhere.example/s.xml")
    pol = FetchPolicy.for_site("shop", shop(allowed_domains=("127.0.0.1",)), True)
    with pytest.raises(SitemapError, match=r"'elsewhere\.example' is not in the allowed"):
        list(expand(sitemap_seed(f"{site.url}/away.xml"), lambda site_id: pol))


def test_listed_urls_outside_the_allowed_domains_are_rejected_at_their_position(
        site: SitemapHost) -> None:
    site.pages["/s.xml"] = urlset(["https://shop.example/1", "https://evil.example/2",
                                   "https://www.shop.example/3", f"{site.url}/4"])
    config = shop(allowed_domains=("shop.example", "127.0.0.1"))
    items = list(expand(sitemap_seed(f"{site.url}/s.xml"),
                        lambda site_id: FetchPolicy.for_site(site_id, config, True)))
    assert [(i.position if isinstance(i, UrlError) else i.url) for i in items] == [
        "https://shop.example/1", 1, "https://www.shop.example/3", f"{site.url}/4"]
    [error] = [i for i in items if isinstance(i, UrlError)]
    assert "'evil.example' is not in the allowed domains of site shop" in error.reason
    assert all(isinstance(i, (ExecTask, UrlError)) for i in items)


def test_the_sites_headers_user_agent_and_robots_txt(site: SitemapHost) -> None:
    site.pages["/robots.txt"] = b"User-agent: ShopBot\nDisallow: /private/\n"
    site.pages["/public/s.xml"] = site.pages["/private/s.xml"] = urlset(["https://shop.example/"])
    site.redirects["/public/hop.xml"] = (302, "/private/s.xml")
    config = shop(headers={"Accept-Language": "fr"}, user_agents=("ShopBot/2.0", "Other/1"))
    pol = FetchPolicy.for_site("shop", config, True)
    assert list(expand_sitemap({"url": f"{site.url}/public/s.xml"}, pol)) == [
        "https://shop.example/"]
    for path in ("/private/s.xml", "/public/hop.xml"):
        with pytest.raises(SitemapError, match=r"disallowed by the robots\.txt"):
            list(expand_sitemap({"url": f"{site.url}{path}"}, pol))
    assert site.paths() == ["/robots.txt", "/public/s.xml", "/robots.txt", "/robots.txt",
                            "/public/hop.xml"]  # robots.txt read once per fetcher (seed run)
    for _path, headers in site.requests:
        assert headers["User-Agent"] == "ShopBot/2.0" and headers["Accept-Language"] == "fr"
    ignoring = FetchPolicy.for_site("shop", shop(robots=False), True)
    assert list(expand_sitemap({"url": f"{site.url}/private/s.xml"}, ignoring))


def test_no_robots_txt_means_everything_is_allowed(site: SitemapHost) -> None:
    site.pages["/s.xml"] = urlset(["https://shop.example/"])
    assert list(expand_sitemap({"url": f"{site.url}/s.xml"}, FetchPolicy(True))) == [
        "https://shop.example/"]
    assert site.paths() == ["/robots.txt", "/s.xml"]
    assert site.requests[1][1]["User-Agent"] == "meteorseed-seed-expand"


# -- the deadline --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["body", "headers"])
def test_a_drip_longer_than_the_deadline_is_refused_with_the_reason(site: SitemapHost,
                                                                   kind: str) -> None:
    # Each byte comes well within the per-read timeout: only the whole-fetch deadline ends it.
    (site.drips if kind == "body" else site.slow_headers)["/slow.xml"] = 0.02
    pol = policy(deadline=0.5, timeout=10.0)
    with pytest.raises(SitemapError) as info:
        list(expand(sitemap_seed(f"{site.url}/slow.xml"), lambda site_id: pol))
    assert "no complete answer within the 0.5 s deadline" in str(info.value)
    assert site.dripping.is_set()


def test_a_server_that_stops_sending_times_out(site: SitemapHost) -> None:
    site.drips["/stalled.xml"] = 3600.0  # the start of a body, then nothing
    with pytest.raises(FetchError, match=r"no data for 0\.2 s"):
        fetch(f"{site.url}/stalled.xml", policy(timeout=0.2, deadline=60.0))


def test_a_cancelled_expansion_stops_its_fetch_at_once(site: SitemapHost) -> None:
    site.drips["/slow.xml"] = 0.02
    stop = threading.Event()
    threading.Thread(target=lambda: site.dripping.wait(60) and stop.set(), daemon=True).start()
    with pytest.raises(FetchError, match="stopped"):
        fetch(f"{site.url}/slow.xml", policy(deadline=600.0, stop=stop))


def test_a_body_cut_short_is_an_error(site: SitemapHost) -> None:
    site.drips["/cut.xml"] = 0.01
    threading.Thread(target=lambda: site.dripping.wait(60) and site.end_drips(),
                     daemon=True).start()
    with pytest.raises(FetchError, match="closed before the end of the body"):
        fetch(f"{site.url}/cut.xml", policy(deadline=60.0))


# -- whatever a sitemap lists ------------------------------------------------------------------

@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(locs=st.lists(st.one_of(
    st.text(max_size=40),
    st.sampled_from(["http://[::1", "https://shop.example:99999/", "https://shop.example/ok",
                     "http://evil.example/", "javascript:alert(1)", "https://SHOP.example./x",
                     "https://user@shop.example/", "//shop.example/x", "https://[v1.x]/"]),
    st.builds(lambda p: f"https://shop.example/{p}", st.text(max_size=20))), max_size=8))
def test_any_listed_url_becomes_a_task_or_a_rejection_at_its_position(
        site: SitemapHost, locs: list[str]) -> None:
    from xml.sax.saxutils import escape

    cleaned = ["".join(c for c in loc if c.isprintable()) for loc in locs]
    site.pages["/s.xml"] = urlset([escape(loc) for loc in cleaned])
    config = shop(allowed_domains=("shop.example", "127.0.0.1"))
    items = list(expand(sitemap_seed(f"{site.url}/s.xml"),
                        lambda site_id: FetchPolicy.for_site(site_id, config, True)))
    kept = [loc.strip() for loc in cleaned if loc.strip()]  # (what the parser keeps)
    assert len(items) == len(kept)
    for position, item in enumerate(items):
        if isinstance(item, UrlError):
            assert item.position == position and item.reason
        else:
            assert isinstance(item, ExecTask) and item.url == kept[position]
            assert FetchPolicy(allowed_domains=("shop.example", "127.0.0.1")).domain_problem(
                item.url) is None
