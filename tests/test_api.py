"""``meteorseed serve``: the dispatch API over real HTTP, on a real Redis."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.api.app import create_app
from meteorseed_scrapy.api.config import ApiConfig
from meteorseed_scrapy.api.expansion import Progress
from meteorseed_scrapy.api.openapi import build_spec
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.testing.polling import wait_for
from tests.api_helpers import TOKEN, ApiServer, Client, stream_tasks, url_list
from tests.e2e_helpers import running, terminate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sites_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "sites"
    directory.mkdir()
    (directory / "news.json").write_text(json.dumps({
        "site_id": "news", "version": 1, "allowed_domains": ["news.example"],
        "list": {"links": "a::attr(href)"}, "fields": {"title": "h1::text"},
        "blacklist": ["/login"],
    }))
    return directory


@pytest.fixture
def client(api_server: ApiServer, sites_dir: Path) -> Iterator[Client]:
    # (the sitemap sites of these tests serve on loopback)
    with api_server(sites_dir=str(sites_dir), fetch_private_addresses=True) as server:
        yield Client(server.url)


# --- authentication -------------------------------------------------------------------------

@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", ""])
def test_missing_or_wrong_token_is_401(client: Client, token: str | None) -> None:
    for method, path in (("GET", "/seeds"), ("POST", "/dispatch"), ("GET", "/status"),
                         ("DELETE", "/seeds/x"), ("GET", "/no-such-route")):
        status, headers, body = client.call(method, path, {} if method == "POST" else None,
                                            token=token)
        assert status == 401, (method, path)
        assert headers["Content-Type"].startswith("application/problem+json")
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert body["status"] == 401 and "token" in body["detail"]


def test_basic_scheme_is_refused_and_bearer_is_case_insensitive(client: Client) -> None:
    status, _, _ = client.call("GET", "/seeds", token=None,
                               headers={"Authorization": f"Basic {TOKEN}"})
    assert status == 401
    status, _, _ = client.call("GET", "/seeds", token=None,
                               headers={"Authorization": f"bearer {TOKEN}"})
    assert status == 200


def test_openapi_and_console_page_are_public(client: Client) -> None:
    status, _, spec = client.call("GET", "/openapi.json", token=None)
    assert status == 200 and spec["openapi"].startswith("3.")
    for path in ("/console/", "/console", "/"):  # (urllib follows the redirects)
        status, headers, page = client.call("GET", path, token=None)
        assert status == 200 and "<title>MeteorSeed console</title>" in page
    assert client.call("GET", "/console/nope.js", token=None)[0] == 404
    assert client.call("GET", "/console/..%2Fapp.py", token=None)[0] == 404
    assert "script-src 'self'" in headers["Content-Security-Policy"]


# --- dispatch -------------------------------------------------------------------------------

def test_dispatch_one_seed_enqueues_its_tasks(client: Client, sync_redis: redis.Redis,
                                              namespace: str) -> None:
    urls = [f"https://news.example/a/{i}" for i in range(5)]
    status, _, body = client.call("POST", "/dispatch", url_list("s1", urls))
    assert status == 202, body
    assert body["accepted"] == 1 and body["enqueued"] == 5 and body["rejected_urls"] == 0
    assert body["seeds"][0] == {"index": 0, "seed_id": "s1", "state": "done", "enqueued": 5,
                                "duplicates": 0, "rejected": 0, "href": "/seeds/s1"}
    tasks = stream_tasks(sync_redis, namespace)
    assert sorted(t["url"] for t in tasks) == sorted(urls)
    assert {t["seed_id"] for t in tasks} == {"s1"} and {t["site_id"] for t in tasks} == {"news"}
    # Dispatched tasks wait in the realtime lane, ahead of scheduled re-crawls.
    realtime = KeyLayout(namespace).stream_for("realtime", 0)
    assert {t["lane"] for t in tasks} == {"realtime"}
    assert sync_redis.xlen(realtime) == 5
    # Again: fleet-wide dedup, nothing new in the stream.
    status, _, body = client.call("POST", "/dispatch", url_list("s1", urls))
    assert status == 202 and body["enqueued"] == 0 and body["duplicates"] == 5
    assert len(stream_tasks(sync_redis, namespace)) == 5


def test_a_seed_may_name_its_lane(client: Client, sync_redis: redis.Redis,
                                  namespace: str) -> None:
    status, _, body = client.call("POST", "/dispatch", [
        url_list("sched", ["https://news.example/s"], lane="scheduled"),
        url_list("bad-lane", ["https://news.example/b"], lane="express")])
    assert status == 202 and body["enqueued"] == 1
    assert body["errors"][0]["field"] == "seeds[1].lane"
    [task] = stream_tasks(sync_redis, namespace)
    assert task.get("lane", "scheduled") == "scheduled"
    assert sync_redis.xlen(KeyLayout(namespace).stream_for("scheduled", 0)) == 1


def test_dispatch_list_forms(client: Client, sync_redis: redis.Redis, namespace: str) -> None:
    status, _, body = client.call("POST", "/dispatch", [
        url_list("a", ["https://news.example/1"]), url_list("b", ["https://news.example/2"])])
    assert status == 202 and body["accepted"] == 2 and body["enqueued"] == 2
    status, _, body = client.call("POST", "/dispatch", {"seeds": [
        url_list("c", ["https://news.example/3"])]})
    assert status == 202 and body["enqueued"] == 1
    assert len(stream_tasks(sync_redis, namespace)) == 3


def test_bad_input_is_rejected_with_field_paths_and_the_rest_goes_through(
        client: Client, sync_redis: redis.Redis, namespace: str) -> None:
    long_url = "https://news.example/" + "a" * 2100
    seeds = [
        url_list("good", [
            "https://news.example/ok/1",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "https://evil.example/x",
            long_url,
            "https://www.news.example/ok/2",
            "https://news.example/login",
        ]),
        {"seed_id": "bad-type", "site_id": "news", "task_type": "ftp_list", "payload": {}},
        {"seed_id": "huge", "site_id": "news", "task_type": "url_template",
         "payload": {"template": "https://news.example/p/{a}/{b}",
                     "params": {"a": {"start": 0, "stop": 100000},
                                "b": {"start": 0, "stop": 100000}}}},
        url_list("no-rules", ["https://anywhere.example/1"], site_id="unconfigured_site"),
        {"seed_id": "missing", "site_id": "news", "task_type": "url_list"},
        "not an object",
    ]
    status, _, body = client.call("POST", "/dispatch", seeds)
    assert status == 202, body
    fields = {e["field"]: e["problem"] for e in body["errors"]}
    for i in (1, 2, 3):
        assert "http(s)" in fields[f"seeds[0].payload.urls[{i}]"]
    assert "allowed domains" in fields["seeds[0].payload.urls[4]"]
    assert "2048" in fields["seeds[0].payload.urls[5]"]
    assert "blacklist" in fields["seeds[0].payload.urls[7]"]
    assert "ftp_list" in fields["seeds[1].task_type"]
    assert "limit" in fields["seeds[2].payload.params"]
    assert "missing" in fields["seeds[4].payload"]
    assert "seeds[5]" in fields
    assert body["accepted"] == 2 and body["rejected_seeds"] == 4
    assert body["enqueued"] == 3 and body["rejected_urls"] == 6
    urls = sorted(t["url"] for t in stream_tasks(sync_redis, namespace))
    assert urls == ["https://anywhere.example/1", "https://news.example/ok/1",
                    "https://www.news.example/ok/2"]


def test_rules_pushed_to_redis_restrict_domains_too(api_server: ApiServer, namespace: str,
                                                    sites_dir: Path,
                                                    sync_redis: redis.Redis) -> None:
    from meteorseed_scrapy.sites.remote import RemoteRules, collect

    RemoteRules(sync_redis, KeyLayout(namespace)).push(collect(sites_dir))
    with api_server() as server:  # no sites_dir
        status, _, body = Client(server.url).call("POST", "/dispatch", url_list(
            "pushed", ["https://news.example/1", "https://evil.example/2"]))
        assert status == 202 and body["enqueued"] == 1
        assert body["errors"][0]["field"] == "payload.urls[1]"
        assert "allowed domains of site news" in body["errors"][0]["problem"]
        status, _, sites = Client(server.url).call("GET", "/sites")
        assert next(r for r in sites["sites"] if r["site_id"] == "news")["configured"] is True


def test_single_seed_errors_have_no_list_prefix(client: Client) -> None:
    status, headers, body = client.call("POST", "/dispatch", {
        "seed_id": "t", "site_id": "news", "task_type": "url_template",
        "payload": {"template": "https://news.example/{x}", "params": {}}})
    assert status == 422
    assert headers["Content-Type"].startswith("application/problem+json")
    assert body["errors"] == [{"field": "payload.params", "problem": "must be a non-empty object"}]


def test_a_payload_field_its_type_lacks_is_422_naming_it(client: Client) -> None:
    status, _, body = client.call("POST", "/dispatch", {"seeds": [{
        "seed_id": "t", "site_id": "news", "task_type": "url_template",
        "payload": {"template": "https://news.example/{d}", "params": {
            "d": {"start": "2024-01-01", "stop": "2024-12-31", "step": 7}}}}]})
    assert status == 422
    assert body["errors"] == [{"field": "seeds[0].payload.params.d.step", "problem":
                               "is not a field of a date range (expected format, start, "
                               "step_days, stop)"}]


@pytest.mark.parametrize("raw, problem", [
    (b'{"seed_id": "x", ', "not valid JSON"),
    (b"\xff\xfe", "UTF-8"),
    (b"42", "must be a seed object"),
    (b"[]", "must not be empty"),
])
def test_malformed_body_is_422_naming_the_body(client: Client, raw: bytes, problem: str) -> None:
    status, _, body = client.call("POST", "/dispatch", raw=raw)
    assert status == 422
    assert len(body["errors"]) == 1 and problem in body["errors"][0]["problem"]
    assert body["errors"][0]["field"] in ("body", "seeds")


def test_a_field_beside_seeds_is_422_naming_it_not_taken_for_a_seed(client: Client) -> None:
    seed = {"seed_id": "a", "site_id": "news", "task_type": "url_list",
            "payload": {"urls": ["https://news.example/1"]}}
    status, _, body = client.call("POST", "/dispatch", {"seeds": [seed], "wait": True})
    assert status == 422
    assert body["errors"] == [{"field": "wait", "problem":
                               'is not a field of {"seeds": [...]} (expected seeds)'}]


def test_nothing_accepted_is_422_listing_every_error(client: Client) -> None:
    status, _, body = client.call("POST", "/dispatch", [
        {"seed_id": "a", "site_id": "news", "task_type": "nope", "payload": {}},
        {"seed_id": "b b", "site_id": "news", "task_type": "url_list", "payload": {"urls": []}},
    ])
    assert status == 422
    assert [e["field"] for e in body["errors"]] == ["seeds[0].task_type", "seeds[1].seed_id"]


def test_too_many_urls_in_one_seed_is_422(client: Client) -> None:
    urls = [f"https://news.example/{i}" for i in range(10_001)]
    status, _, body = client.call("POST", "/dispatch", url_list("many", urls))
    assert status == 422
    assert body["errors"][0]["field"] == "payload.urls"
    assert "10000" in body["errors"][0]["problem"]


def test_oversized_body_is_413(client: Client, sync_redis: redis.Redis, namespace: str) -> None:
    urls = [f"https://news.example/{'x' * 1000}/{i}" for i in range(2200)]
    status, headers, body = client.call("POST", "/dispatch", url_list("big", urls))
    assert status == 413
    assert headers["Content-Type"].startswith("application/problem+json")
    assert "2097152" in body["detail"]
    assert stream_tasks(sync_redis, namespace) == []


def test_a_full_backlog_is_503_before_anything_is_registered(api_server: ApiServer) -> None:
    with api_server(max_backlog=2) as server:
        client = Client(server.url)
        status, _, _ = client.call("POST", "/dispatch", url_list(
            "first", [f"https://news.example/{i}" for i in range(3)]))
        assert status == 202
        status, headers, body = client.call("POST", "/dispatch", url_list(
            "second", ["https://news.example/x"]))
        assert status == 503 and headers["Retry-After"] == "30"
        assert "3 tasks are waiting" in body["detail"]
        assert "METEORSEED_MAX_BACKLOG" in body["detail"]
        assert client.call("GET", "/seeds/second")[0] == 404


def test_large_seed_expands_in_the_background(client: Client, sync_redis: redis.Redis,
                                              namespace: str) -> None:
    seed = {"seed_id": "pages", "site_id": "news", "task_type": "url_template",
            "payload": {"template": "https://news.example/page/{n}",
                        "params": {"n": {"start": 1, "stop": 3000}}}}
    status, _, body = client.call("POST", "/dispatch", seed)
    assert status == 202 and body["seeds"][0]["href"] == "/seeds/pages"
    deadline = time.monotonic() + 60
    while True:
        status, _, record = client.call("GET", "/seeds/pages")
        assert status == 200
        if record["expansion"]["state"] != "expanding" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert record["expansion"]["state"] == "done"
    assert record["expansion"]["enqueued"] == 3000
    assert record["runs"] == 1 and record["last_enqueued"] == 3000
    assert len(stream_tasks(sync_redis, namespace)) == 3000


@pytest.mark.parametrize("path", ["/seeds/pages", "/seeds"])
def test_an_expansion_shown_finished_comes_with_its_run(client: Client, path: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GET reads the registry while the expansion records its run and finishes: the answer
    never shows the expansion finished without that run (made certain: the run's record waits
    for the GET's registry read, and that read returns only once the expansion finished)."""
    armed, read, finished = threading.Event(), threading.Event(), threading.Event()
    name = "list" if path == "/seeds" else "get"
    registry_read, record_run, finish = getattr(SeedRegistry, name), SeedRegistry.record_run, \
        Progress.finish

    async def slow_read(self: SeedRegistry, *args: Any, **kwargs: Any) -> Any:
        result = await registry_read(self, *args, **kwargs)
        if armed.is_set() and not read.is_set():
            read.set()
            while not finished.is_set():
                await asyncio.sleep(0.01)
        return result

    async def late_record(self: SeedRegistry, *args: Any, **kwargs: Any) -> Any:
        while not read.is_set():
            await asyncio.sleep(0.01)
        return await record_run(self, *args, **kwargs)

    def noted_finish(self: Progress, *args: Any, **kwargs: Any) -> None:
        finish(self, *args, **kwargs)
        finished.set()

    monkeypatch.setattr(SeedRegistry, name, slow_read)
    monkeypatch.setattr(SeedRegistry, "record_run", late_record)
    monkeypatch.setattr(Progress, "finish", noted_finish)
    seed = {"seed_id": "pages", "site_id": "news", "task_type": "url_template",
            "payload": {"template": "https://news.example/page/{n}",
                        "params": {"n": {"start": 1, "stop": 5}}}}
    assert client.call("POST", "/dispatch", seed)[0] == 202
    armed.set()

    def shown() -> tuple[str, int]:
        status, _, body = client.call("GET", path)
        assert status == 200, body
        record = body if path != "/seeds" else next(
            s for s in body["seeds"] if s["seed"]["seed_id"] == "pages")
        return record["expansion"]["state"], record["runs"]

    assert shown() == ("expanding", 0)  # read before the run was recorded: not yet finished
    assert finished.is_set()
    assert shown() == ("done", 1)


def _wait_expansion(client: Client, seed_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        status, _, record = client.call("GET", f"/seeds/{seed_id}")
        assert status == 200, record
        if record["expansion"]["state"] != "expanding" or time.monotonic() > deadline:
            return record
        time.sleep(0.05)


@pytest.fixture
def sitemap_site() -> Iterator[str]:
    body = ('<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            + "".join(f"<url><loc>{u}</loc></url>" for u in (
                "https://news.example/s/1", "https://evil.example/s/2",
                "https://news.example/s/3")) + "</urlset>").encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/sitemap.xml"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/xml")
            self.end_headers()
            if found:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def maps_site(sites_dir: Path) -> None:
    """A site whose sitemaps are on the loopback (a sitemap's own URL must be inside its site's
    allowed domains too), written before the server starts: the server reads its rules once a
    second at most, and its history sampler may have read them just after the start."""
    (sites_dir / "maps.json").write_text(json.dumps({
        "site_id": "maps", "version": 1, "allowed_domains": ["news.example", "127.0.0.1"],
        "list": {"links": "a::attr(href)"}, "fields": {"title": "h1::text"}}))


def test_sitemap_expands_in_the_background_with_its_rejections(
        maps_site: None, client: Client, sitemap_site: str, sync_redis: redis.Redis,
        namespace: str) -> None:
    status, _, body = client.call("POST", "/dispatch", {"seeds": [
        {"seed_id": "map", "site_id": "maps", "task_type": "sitemap",
         "payload": {"url": f"{sitemap_site}/sitemap.xml"}},
        {"seed_id": "gone", "site_id": "maps", "task_type": "sitemap",
         "payload": {"url": f"{sitemap_site}/missing.xml"}}]})
    assert status == 202 and [s["state"] for s in body["seeds"]] == ["expanding"] * 2
    record = _wait_expansion(client, "map")
    assert record["expansion"]["state"] == "done" and record["expansion"]["enqueued"] == 2
    [error] = record["expansion"]["errors"]
    assert error["field"] == "seeds[0].payload.url" and "URL #1" in error["problem"]
    assert "evil.example" in error["problem"]
    failed = _wait_expansion(client, "gone")
    assert failed["expansion"]["state"] == "failed" and "404" in failed["expansion"]["error"]
    assert failed["runs"] == 1 and failed["failures"] == 1 and "404" in failed["last_error"]
    assert sorted(t["url"] for t in stream_tasks(sync_redis, namespace)) == [
        "https://news.example/s/1", "https://news.example/s/3"]


def test_delete_stops_a_running_expansion_and_a_running_seed_is_not_dispatched_twice(
        client: Client, sync_redis: redis.Redis, namespace: str) -> None:
    seed = {"seed_id": "million", "site_id": "news", "task_type": "url_template",
            "payload": {"template": "https://news.example/m/{n}",
                        "params": {"n": {"start": 1, "stop": 1_000_000}}}}
    status, _, body = client.call("POST", "/dispatch", seed)
    assert status == 202 and body["seeds"][0]["state"] == "expanding"
    status, _, again = client.call("POST", "/dispatch", seed)
    assert status == 422 and again["errors"][0]["field"] == "seed_id"
    assert "still being expanded" in again["errors"][0]["problem"]
    status, _, deleted = client.call("DELETE", "/seeds/million")
    assert status == 200 and deleted["expansion_cancelled"] is True
    assert client.call("GET", "/seeds/million")[0] == 404
    enqueued = len(stream_tasks(sync_redis, namespace))
    assert enqueued < 1_000_000
    time.sleep(0.5)  # nothing more arrives once the DELETE has answered
    assert len(stream_tasks(sync_redis, namespace)) == enqueued


# --- seeds ----------------------------------------------------------------------------------

def test_get_list_and_delete_seeds(client: Client) -> None:
    client.call("POST", "/dispatch", [url_list("n1", ["https://news.example/1"]),
                                      url_list("o1", ["https://other.example/1"], "other")])
    status, _, record = client.call("GET", "/seeds/n1")
    assert status == 200
    # Run once: its URL list was let go, a count and a digest kept (seeding/registry.py).
    payload = record["seed"]["payload"]
    assert payload["urls"] == [] and payload["urls_count"] == 1 and payload["urls_sha256"]
    assert record["runs"] == 1 and record["last_error"] is None
    assert record["expansion"]["state"] == "done"
    assert record["next_due"] is None  # no schedule: it ran once, no seeder runs it again
    status, _, page = client.call("GET", "/seeds")
    assert status == 200 and page["total"] == 2
    assert [s["seed_id"] for s in page["seeds"]] == ["n1", "o1"]
    assert "payload" not in page["seeds"][0]["seed"]
    assert page["seeds"][0]["seed"]["payload_bytes"] == len(json.dumps(payload))
    status, _, page = client.call("GET", "/seeds?site_id=other")
    assert [s["seed_id"] for s in page["seeds"]] == ["o1"]
    status, _, page = client.call("GET", "/seeds?limit=1&offset=1")
    assert [s["seed_id"] for s in page["seeds"]] == ["o1"]
    status, _, body = client.call("GET", "/seeds?limit=0")
    assert status == 422 and body["errors"][0]["field"] == "query.limit"
    status, _, body = client.call("DELETE", "/seeds/n1")
    assert status == 200 and body["deleted"] == "n1"
    assert client.call("GET", "/seeds/n1")[0] == 404
    assert client.call("DELETE", "/seeds/n1")[0] == 404


def test_a_scheduled_seed_runs_now_and_is_left_to_the_seeders(client: Client) -> None:
    before = time.time()
    status, _, body = client.call("POST", "/dispatch", url_list(
        "hourly", ["https://news.example/latest"], schedule={"every": "1h"}))
    assert status == 202 and body["enqueued"] == 1
    status, _, record = client.call("GET", "/seeds/hourly")
    assert record["runs"] == 1 and record["seed"]["schedule"] == {"every": "1h"}
    # Due again later (its schedule), not now: the seeders take it from here.
    assert record["next_due"] is not None and record["next_due"] > before + 60


def test_unknown_route_is_404_and_wrong_method_405(client: Client) -> None:
    status, headers, body = client.call("GET", "/nowhere")
    assert status == 404 and headers["Content-Type"].startswith("application/problem+json")
    status, headers, body = client.call("GET", "/dispatch")
    assert status == 405 and "POST" in headers["Allow"] and body["status"] == 405


# --- console data ---------------------------------------------------------------------------

def test_status_sites_and_dead_letters(client: Client, sync_redis: redis.Redis,
                                       namespace: str) -> None:
    client.call("POST", "/dispatch", url_list("s", [f"https://news.example/{i}" for i in range(4)]))
    status, _, overview = client.call("GET", "/status")
    assert status == 200 and overview["backlog"] == 4 and overview["seeds"] == 1
    # Redis 6.2 (the test server) has no entries-added: the enqueue script's counter.
    assert overview["throughput"]["added_total"] == 4
    assert overview["throughput"]["finished_total"] == 0
    assert overview["delayed"] == {"total": 0, "next_due_at": None, "next_due_in_s": None,
                                   "scanned": 0, "reasons": {}, "sites": []}
    status, _, again = client.call("GET", "/status")
    rates = again["throughput"]
    assert rates["added_per_s"] == rates["finished_per_s"] == 0  # numbers, not None
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.site("news", "breaker"), mapping={"state": "open", "since": 1})
    status, _, sites = client.call("GET", "/sites")
    row = next(r for r in sites["sites"] if r["site_id"] == "news")
    assert row["breaker"] == "open" and row["configured"] is True and row["anomalies"] is None
    # A site with dedup state (its URLs dispatched above): requeue records the URL again.
    task = {"task_id": "t1", "seed_id": "s", "site_id": "news",
            "url": "https://news.example/<script>", "created_at": 1.0}
    dead_id = sync_redis.xadd(keys.dead, {"t": json.dumps(task), "reason": "boom",
                                          "deliveries": "5", "at": "1700000000"})
    status, _, page = client.call("GET", "/dead-letters")
    assert status == 200 and page["total"] == 1
    assert page["dead_letters"][0]["url"] == "https://news.example/<script>"
    status, _, letter = client.call("GET", f"/dead-letters/{dead_id}")
    assert status == 200 and letter["task"]["task_id"] == "t1" and letter["reason"] == "boom"
    assert client.call("GET", "/dead-letters/not-an-id")[0] == 422
    assert client.call("GET", "/dead-letters/1-1")[0] == 404
    status, _, body = client.call("POST", f"/dead-letters/{dead_id}/requeue")
    assert status == 200 and body["requeued"]["task_id"] == "t1"
    assert sync_redis.xlen(keys.dead) == 0
    assert "https://news.example/<script>" in [t["url"] for t in stream_tasks(sync_redis,
                                                                              namespace)]
    assert client.call("POST", f"/dead-letters/{dead_id}/requeue")[0] == 404


def test_status_shows_delayed_tasks_by_site_reason_and_due_time(
        client: Client, sync_redis: redis.Redis, namespace: str) -> None:
    """Tasks that only wait in the delayed set: backlog and pending are 0, yet not done."""
    keys = KeyLayout(namespace)
    for i, (site, why) in enumerate([("news", 1), ("news", 2), ("<b>shop</b>", 3)]):
        task = {"task_id": f"t{i}", "seed_id": "s", "site_id": site,
                "url": f"https://x.example/{i}", "created_at": 1.0}
        due_ms = (int(sync_redis.time()[0]) + 60 + i) * 1000
        sync_redis.zadd(keys.delayed, {f"retry:normal|{json.dumps(task)}": due_ms - 1 + why / 16})
    status, _, overview = client.call("GET", "/status")
    assert status == 200 and (overview["backlog"], overview["pending"]) == (0, 0)
    delayed = overview["delayed"]
    assert delayed["total"] == 3 and delayed["reasons"] == {"paused": 1, "retry": 1, "sick": 1}
    assert [(s["site_id"], s["count"]) for s in delayed["sites"]] == [("news", 2),
                                                                    ("<b>shop</b>", 1)]
    assert 0 < delayed["next_due_in_s"] <= 61


def test_sites_count_anomalies_from_the_store(api_server: ApiServer, namespace: str,
                                              tmp_path: Path) -> None:
    from meteorseed_scrapy.store.backends import open_store

    uri = f"sqlite:///{tmp_path / 'items.db'}"
    with open_store(uri, namespace) as store:
        store.upsert_anomalies([{"_id": f"news:{i}", "site_id": "news"} for i in range(3)])
    with api_server(store_uri=uri) as server:
        client = Client(server.url)
        client.call("POST", "/dispatch", url_list("s", ["https://news.example/1"]))
        status, _, body = client.call("GET", "/sites")
    assert status == 200 and body["anomalies_error"] is None
    row = next(r for r in body["sites"] if r["site_id"] == "news")
    assert row["anomalies"] == 3 and row["configured"] is False and row["breaker"] == "closed"


# --- OpenAPI --------------------------------------------------------------------------------

def _check_openapi_structure(spec: dict[str, Any]) -> None:
    assert spec["openapi"].startswith("3.")
    assert spec["info"]["title"] and spec["info"]["version"]
    schemes = spec["components"]["securitySchemes"]
    for requirement in spec["security"]:
        assert set(requirement) <= set(schemes)
    for path, item in spec["paths"].items():
        assert path.startswith("/")
        params_in_path = {p.strip("{}") for p in path.split("/") if p.startswith("{")}
        for method, op in item.items():
            assert method in {"get", "post", "put", "delete", "patch", "head", "options"}
            assert op["responses"], (path, method)
            for code, response in op["responses"].items():
                assert code.isdigit() and "description" in response
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == params_in_path, (path, method)
            for p in op.get("parameters", []):
                assert p["in"] in {"path", "query", "header", "cookie"} and "schema" in p
                assert p["in"] != "path" or p["required"] is True
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(spec)
    for ref in refs:
        target: Any = spec
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]


def test_openapi_describes_every_route(client: Client, redis_url: str) -> None:
    status, _, spec = client.call("GET", "/openapi.json", token=None)
    assert status == 200 and spec == json.loads(json.dumps(build_spec()))
    _check_openapi_structure(spec)
    app = create_app(ApiConfig(redis_url=redis_url, token=TOKEN))
    routes = {(r.method.lower(), r.resource.canonical) for r in app.router.routes()
              if r.method != "HEAD" and r.resource is not None}
    described = {(method, path) for path, item in spec["paths"].items() for method in item}
    assert routes == described


# --- Redis down, CLI ------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_redis_down_is_503_and_the_server_keeps_serving(api_server: ApiServer) -> None:
    with api_server(redis_url=f"redis://127.0.0.1:{_free_port()}/0",
                    redis_timeout=1.0) as server:
        client = Client(server.url)
        for method, path, body in (("GET", "/seeds", None), ("GET", "/status", None),
                                   ("GET", "/dead-letters", None), ("GET", "/sites", None),
                                   ("POST", "/dispatch", url_list("s", ["https://a.example/"]))):
            status, headers, problem = client.call(method, path, body)
            assert status == 503, (path, problem)
            assert "Redis" in problem["detail"] and headers["Retry-After"]
        # The failed dispatch left nothing reserved: the same seed gets a 503 again, not a
        # 422 "still being expanded".
        status, _, problem = client.call("POST", "/dispatch", url_list("s", ["https://a.example/"]))
        assert status == 503, problem
        status, _, _ = client.call("GET", "/openapi.json")
        assert status == 200


def test_redis_lost_and_back(api_server: ApiServer) -> None:
    """Redis killed under a running server: 503s, then normal answers once it is back."""
    from meteorseed_scrapy.testing.redis_server import RedisServer

    with RedisServer(appendonly=True) as own_redis, \
            api_server(redis_url=own_redis.url, redis_timeout=1.0) as server:
        client = Client(server.url)
        assert client.call("POST", "/dispatch", url_list(
            "before", ["https://news.example/1"]))[0] == 202
        # (its run is recorded as its expansion ends: killed before, it is not there)
        wait_for(lambda: client.call("GET", "/seeds/before")[2].get("runs") == 1, 30)
        own_redis.kill()
        for path in ("/seeds/before", "/status", "/sites"):
            assert client.call("GET", path)[0] == 503
        assert client.call("POST", "/dispatch", url_list(
            "during", ["https://news.example/2"]))[0] == 503
        own_redis.start()
        status, _, record = client.call("GET", "/seeds/before")
        assert status == 200 and record["runs"] == 1
        status, _, body = client.call("POST", "/dispatch", url_list(
            "after", ["https://news.example/3"]))
        assert status == 202 and body["enqueued"] == 1
        assert client.call("GET", "/status")[2]["backlog"] == 2


def _serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from meteorseed_scrapy.cli import main; "
            "sys.exit(main())", "serve", *args]


def test_serve_refuses_to_start_without_a_token(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "METEORSEED_API_TOKEN"}
    done = subprocess.run(_serve_cmd("--redis-url", redis_url, "--port", str(_free_port())),
                          env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert "METEORSEED_API_TOKEN" in done.stderr and "--insecure-no-auth" in done.stderr


@pytest.mark.parametrize("argv, env_token, expected", [
    (["--token", "t1"], None, "t1"),
    ([], "from-env", "from-env"),
    (["--token", "flag"], "from-env", "flag"),
    (["--insecure-no-auth"], None, None),
])
def test_serve_token_sources(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                             env_token: str | None, expected: str | None) -> None:
    from meteorseed_scrapy.cli import build_parser
    from meteorseed_scrapy.cli.serve import config_from

    monkeypatch.delenv("METEORSEED_API_TOKEN", raising=False)
    if env_token:
        monkeypatch.setenv("METEORSEED_API_TOKEN", env_token)
    args = build_parser().parse_args(["serve", "--redis-url", "redis://127.0.0.1:1/0",
                                      "--namespace", "ns1", *argv])
    config = config_from(args)
    assert config.token == expected
    assert (config.redis_url, config.namespace) == ("redis://127.0.0.1:1/0", "ns1")


@pytest.mark.parametrize("argv, message", [
    (["--token", "t", "--insecure-no-auth"], "choose one"),
    (["--token", " "], "must not be empty"),
    (["--token", "t", "--port", "0"], "--port"),
    (["--token", "t", "--namespace", "a b"], "METEORSEED_NAMESPACE"),
    (["--token", "t", "--sites-dir", "/nonexistent/dir"], "not a directory"),
])
def test_serve_bad_options_are_one_line_errors(monkeypatch: pytest.MonkeyPatch,
                                               argv: list[str], message: str) -> None:
    from meteorseed_scrapy.cli import build_parser
    from meteorseed_scrapy.cli.common import CliError
    from meteorseed_scrapy.cli.serve import config_from

    monkeypatch.delenv("METEORSEED_API_TOKEN", raising=False)
    args = build_parser().parse_args(["serve", "--redis-url", "redis://127.0.0.1:1/0", *argv])
    with pytest.raises(CliError, match=message.replace("-", r"\-")):
        config_from(args)


def test_serve_command_serves_and_stops_on_sigterm(redis_url: str, namespace: str,
                                                  sync_redis: redis.Redis) -> None:
    port = _free_port()
    env = {**os.environ, "METEORSEED_API_TOKEN": TOKEN}
    with running(_serve_cmd("--redis-url", redis_url, "--namespace", namespace,
                            "--port", str(port)), env=env, cwd=ROOT) as proc:
        client = Client(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _, body = client.call("POST", "/dispatch",
                                              url_list("cli", ["https://news.example/1"]))
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert status == 202 and body["enqueued"] == 1
        # Stopped in the middle of a background expansion (a million URLs).
        status, _, body = client.call("POST", "/dispatch", {
            "seed_id": "long", "site_id": "news", "task_type": "url_template",
            "payload": {"template": "https://news.example/l/{n}",
                        "params": {"n": {"start": 1, "stop": 1_000_000}}}})
        assert status == 202 and body["seeds"][0]["state"] == "expanding"
        err = terminate(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Task was destroyed" not in err
    # The interrupted seed is handed back to the seeders: due now, not leased for minutes.
    due = sync_redis.zscore(KeyLayout(namespace).seeds_due, "long")
    now = float(sync_redis.time()[0])  # type: ignore[index]
    assert due is not None and due <= now + 1
