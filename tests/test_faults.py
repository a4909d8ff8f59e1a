"""The fault-injecting site: its behaviours, switched at run time, and what it records."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message

import pytest

from meteorseed_scrapy.testing.fault_modes import RESET, Hit, Mode, parse_mode, site_of
from meteorseed_scrapy.testing.faults import FaultSite
from meteorseed_scrapy.testing.polling import wait_for


@pytest.fixture
def site() -> Iterator[FaultSite]:
    with FaultSite() as fault_site:
        yield fault_site


def get(url: str) -> tuple[int, Message, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def get_json(url: str) -> dict:
    status, _, body = get(url)
    assert status == 200, body
    return dict(json.loads(body))


def test_normal_pages_have_a_title_unique_per_path_and_query(site: FaultSite) -> None:
    bodies = {get(f"{site.url}{t}")[2] for t in ("/a/1", "/a/1?x=2", "/a/2", "/b/1")}
    assert len(bodies) == 4
    status, headers, body = get(f"{site.url}/a/1?x=2")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"<title>Fault site /a/1?x=2</title>" in body
    assert get(f"{site.url}/a/1?x=2")[2] == body  # deterministic


def _finished_hits(site: FaultSite, name: str) -> list[Hit]:
    """The site's hits once each has its finish stamped (just after its response went out:
    the client may have the response a moment earlier)."""
    return wait_for(lambda: (hits := site.hits(name)) and all(h.finish is not None for h in hits)
                    and hits, timeout=30, interval=0.01)


def test_records_each_request_under_its_site(site: FaultSite) -> None:
    for target in ("/a/1", "/a/2", "/b/1?q=1"):
        get(f"{site.url}{target}")
    assert site.sites() == ["a", "b"]
    hits = _finished_hits(site, "a")
    assert [h.target for h in hits] == ["/a/1", "/a/2"]
    assert [h.status for h in hits] == [200, 200]
    for hit in hits:
        assert hit.finish is not None and hit.finish >= hit.arrival
        assert hit.finish_wall is not None and hit.finish_wall >= hit.arrival_wall
    assert site.arrivals("/a/") == [h.arrival for h in hits]
    assert site.hits("b")[0].target == "/b/1?q=1"


def test_counts_parallel_slow_requests_in_flight(site: FaultSite) -> None:
    site.set_mode("a", "slow", delay=3)  # long enough for all 16 to arrive before one leaves
    n = 16
    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(get(f"{site.url}/a/{i}")[0]))
               for i in range(n)]
    for thread in threads:
        thread.start()
    wait_for(lambda: site.in_flight("a") == n, timeout=30, interval=0.01)
    for thread in threads:
        thread.join()
    assert results == [200] * n
    assert site.in_flight("a") == 0
    assert site.max_in_flight("a") == n
    assert sorted(h.in_flight for h in site.hits("a")) == list(range(1, n + 1))
    # finish is stamped after the response went out: the client may have it a moment earlier.
    wait_for(lambda: all(h.finish is not None for h in site.hits("a")), timeout=30,
             interval=0.01)
    assert all(h.finish is not None and h.finish - h.arrival >= 3 for h in site.hits("a"))


def test_sequential_requests_never_overlap_in_the_count(site: FaultSite) -> None:
    # The count drops before the response is written: a client that sends its next request
    # after reading a response must never see two in flight.
    for i in range(50):
        get(f"{site.url}/a/{i}")
    assert site.max_in_flight("a") == 1
    assert site.max_in_flight("b") == 0


def test_429_with_retry_after_once_then_normal(site: FaultSite) -> None:
    site.set_mode("a", 429, retry_after=3, times=1)
    status, headers, body = get(f"{site.url}/a/1")
    assert (status, headers["Retry-After"]) == (429, "3")
    assert b"<title>429 /a/1</title>" in body
    assert get(f"{site.url}/b/1")[0] == 200  # other sites unaffected
    status, headers, _ = get(f"{site.url}/a/1")
    assert status == 200 and headers["Retry-After"] is None
    assert [h.status for h in site.hits("a")] == [429, 200]


def test_status_n_times(site: FaultSite) -> None:
    site.set_mode("a", "503", times=3)
    assert [get(f"{site.url}/a/{i}")[0] for i in range(5)] == [503, 503, 503, 200, 200]


def test_403_lasts_until_switched_back(site: FaultSite) -> None:
    site.set_mode("a", 403)
    assert [get(f"{site.url}/a/{i}")[0] for i in range(3)] == [403] * 3
    site.set_mode("a", "ok")
    assert get(f"{site.url}/a/9")[0] == 200


def test_status_for_a_time_window_then_the_lasting_mode(site: FaultSite) -> None:
    site.set_mode("a", 503, duration=0.5)
    assert get(f"{site.url}/a/1")[0] == 503
    assert site.mode("a").status == 503
    wait_for(lambda: site.mode("a") == Mode(), timeout=30, interval=0.01)
    assert get(f"{site.url}/a/2")[0] == 200


def test_a_time_window_from_the_first_hit_starts_with_that_request(site: FaultSite) -> None:
    site.set_mode("a", 503, duration=0.5, from_first_hit=True)
    set_at = time.monotonic()
    wait_for(lambda: time.monotonic() - set_at > 0.6, timeout=30, interval=0.05)
    assert site.mode("a").status == 503  # no request yet: its window has not begun
    first = time.monotonic()
    assert get(f"{site.url}/a/1")[0] == 503
    wait_for(lambda: site.mode("a") == Mode(), timeout=30, interval=0.01)
    assert time.monotonic() - first >= 0.5
    assert get(f"{site.url}/a/2")[0] == 200
    with pytest.raises(ValueError, match="from_first_hit"):
        site.set_mode("a", 503, times=2, from_first_hit=True)


def test_temporary_mode_falls_back_to_the_lasting_one(site: FaultSite) -> None:
    site.set_mode("a", 503)
    site.set_mode("a", 429, retry_after="Wed, 21 Oct 2065 07:28:00 GMT", times=1)
    status, headers, _ = get(f"{site.url}/a/1")
    assert (status, headers["Retry-After"]) == (429, "Wed, 21 Oct 2065 07:28:00 GMT")
    assert get(f"{site.url}/a/2")[0] == 503
    site.set_mode("a", "ok")  # a lasting mode also ends a temporary one
    assert get(f"{site.url}/a/3")[0] == 200


def test_connection_reset_closes_without_a_response(site: FaultSite) -> None:
    site.set_mode("a", "reset", times=1)
    with pytest.raises(ConnectionError):
        get(f"{site.url}/a/1")
    assert get(f"{site.url}/a/2")[0] == 200
    assert [h.status for h in site.hits("a")] == [RESET, 200]
    assert site.in_flight("a") == 0


def test_delay_applies_to_error_statuses_too(site: FaultSite) -> None:
    site.set_mode("a", 503, delay=0.3)
    assert get(f"{site.url}/a/1")[0] == 503
    (hit,) = _finished_hits(site, "a")
    assert hit.finish is not None and hit.finish - hit.arrival >= 0.3


def test_reset_forgets_records_but_keeps_modes(site: FaultSite) -> None:
    site.set_mode("a", 403)
    get(f"{site.url}/a/1")
    site.reset()
    assert site.arrivals("a") == [] and site.max_in_flight("a") == 0 and site.sites() == []
    assert get(f"{site.url}/a/2")[0] == 403
    assert len(site.arrivals("a")) == 1


def test_rate_counts_arrivals_in_a_half_open_window(site: FaultSite) -> None:
    assert site.rate("a") == 0.0
    for i in range(5):
        get(f"{site.url}/a/{i}")
    times = site.arrivals("a")
    assert site.rate("a") == pytest.approx(4 / (times[-1] - times[0]))
    assert site.rate("a", times[1], times[3]) == pytest.approx(2 / (times[3] - times[1]))
    assert site.rate("a", times[-1] + 1, times[-1] + 3) == 0.0
    assert site.rate("a", times[2], times[2]) == 0.0


def test_http_control_endpoints(site: FaultSite) -> None:
    reply = get_json(f"{site.url}/_mode?site=a&mode=429&retry_after=5&times=2")
    assert reply["mode"] == {"status": 429, "delay": 0.0, "retry_after": "5"}
    assert [get(f"{site.url}/a/{i}")[0] for i in range(3)] == [429, 429, 200]
    stats = get_json(f"{site.url}/_stats")
    assert list(stats["sites"]) == ["a"]  # control requests are not recorded
    a = stats["sites"]["a"]
    assert (a["requests"], a["max_in_flight"], a["statuses"]) == (3, 1, {"429": 2, "200": 1})
    assert [h["target"] for h in a["hits"]] == ["/a/0", "/a/1", "/a/2"]
    assert {"arrival", "arrival_wall", "finish", "finish_wall", "in_flight"} <= set(a["hits"][0])
    assert "hits" not in get_json(f"{site.url}/_stats?site=a&hits=0")["sites"]["a"]
    assert get(f"{site.url}/_mode?site=a&mode=teapot")[0] == 400
    assert get(f"{site.url}/_nothing")[0] == 404
    assert get_json(f"{site.url}/_reset") == {"reset": True}
    assert get_json(f"{site.url}/_stats")["sites"] == {}


def test_parse_mode_and_site_of() -> None:
    assert parse_mode("slow") == Mode(200, 1.0)
    assert parse_mode("slow", delay=0.2) == Mode(200, 0.2)
    assert parse_mode(429, retry_after=3.0) == Mode(429, 0.0, "3")
    assert parse_mode("reset") == Mode(RESET)
    for bad in ("teapot", 999, "42"):
        with pytest.raises(ValueError):
            parse_mode(bad)
    with pytest.raises(ValueError):
        parse_mode("ok", retry_after=3)
    with pytest.raises(ValueError):
        parse_mode("slow", delay=-1)
    assert [site_of(p) for p in ("/a/1", "a", "/a", "/b/c/d", "/")] == ["a", "a", "a", "b", ""]


def test_set_mode_rejects_bad_limits(site: FaultSite) -> None:
    with pytest.raises(ValueError):
        site.set_mode("a", 503, times=0)
    with pytest.raises(ValueError):
        site.set_mode("a", 503, duration=0)


def test_refuses_non_loopback_hosts() -> None:
    with pytest.raises(ValueError):
        FaultSite(host="8.8.8.8")


def test_command_line_server() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "meteorseed_scrapy.testing.faults",
                             "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        get_json(f"{url}/_mode?site=x&mode=503&times=1")
        assert [get(f"{url}/x/{i}")[0] for i in range(2)] == [503, 200]
        assert get_json(f"{url}/_stats?hits=0")["sites"]["x"]["requests"] == 2
    finally:
        proc.terminate()
        proc.wait(10)
