"""``meteorseed serve`` against careless input and a hostile web: refused callbacks and meta,
sitemaps on private addresses or outside the site's domains, and slow sitemaps that cannot tie
the server up (a cap on background expansions, 503 with Retry-After beyond it). Real HTTP, a
real Redis, sitemap sites on 127.0.0.1 only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meteorseed_scrapy.api.expansion import RETRY_AFTER_S
from meteorseed_scrapy.seeding.addresses import PRIVATE_SETTING
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.testing.sitemaps import SitemapHost
from tests.api_helpers import ApiServer, Client


def sitemap(seed_id: str, url: str, site_id: str = "open") -> dict[str, Any]:
    return {"seed_id": seed_id, "site_id": site_id, "task_type": "sitemap",
            "payload": {"url": url}}


@pytest.fixture
def sites_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "sites"
    directory.mkdir()
    (directory / "shop.json").write_text(json.dumps({
        "site_id": "shop", "version": 1, "allowed_domains": ["shop.example"],
        "list": {"links": "a::attr(href)"}, "fields": {"title": "h1::text"}}))
    return directory


@pytest.fixture
def site() -> Iterator[SitemapHost]:
    with SitemapHost() as host:
        yield host


def test_refused_callbacks_and_meta_name_their_field(api_server: ApiServer,
                                                     sites_dir: Path) -> None:
    seeds = [{"seed_id": "a", "site_id": "shop", "task_type": "url_list",
              "payload": {"urls": ["https://shop.example/"]}, **extra}
             for extra in ({"callback": "__init__"}, {"callback": "start_requests"},
                           {"meta": {"proxy": "http://attacker.example:3128"}},
                           {"meta": {"meteorseed_task": {}}})]
    with api_server(token=None, sites_dir=str(sites_dir)) as server:
        status, _, body = Client(server.url, None).call("POST", "/dispatch", {"seeds": seeds})
    assert status == 422
    assert [(e["field"], e["problem"].split(" (")[0]) for e in body["errors"]] == [
        ("seeds[0].callback", "must name a public spider method, not '__init__'"),
        ("seeds[1].callback", "'start_requests' is scrapy.Spider's own, not a callback"),
        ("seeds[2].meta.proxy", "reserved Scrapy key"),
        ("seeds[3].meta.meteorseed_task", "reserved MeteorSeed key")]


def test_private_and_foreign_sitemaps_are_refused_without_a_connection(
        api_server: ApiServer, sites_dir: Path, site: SitemapHost) -> None:
    # the setting is off by default
    with api_server(token=None, sites_dir=str(sites_dir)) as server:
        api = Client(server.url, None)
        status, _, body = api.call("POST", "/dispatch", {"seeds": [
            sitemap("meta", "http://169.254.169.254/latest/meta-data/"),
            sitemap("v6", "http://[::1]:8080/sitemap.xml"),
            sitemap("foreign", f"{site.url}/s.xml", site_id="shop")]})
        assert status == 422
        assert [e["field"] for e in body["errors"]] == [
            "seeds[0].payload.url", "seeds[1].payload.url", "seeds[2].payload.url"]
        assert PRIVATE_SETTING in body["errors"][0]["problem"]
        assert "not in the allowed domains of site shop" in body["errors"][2]["problem"]
        # A name is resolved when the sitemap is fetched: refused then, before connecting.
        status, _, body = api.call("POST", "/dispatch",
                                   sitemap("named", f"http://localhost:{site.port}/s.xml"))
        assert status == 202
        record = wait_for(lambda: (r := api.call("GET", "/seeds/named")[2])
                          ["expansion"]["state"] != "expanding" and r)
    assert record["expansion"]["state"] == "failed"
    assert "refused: localhost (127.0.0.1) is a loopback address" in record["expansion"]["error"]
    assert PRIVATE_SETTING in record["last_error"]
    assert site.requests == []


def test_background_expansions_are_capped_and_the_server_stays_responsive(
        api_server: ApiServer, sites_dir: Path, site: SitemapHost) -> None:
    site.drips["/slow.xml"] = 0.05  # a sitemap that never ends
    with api_server(token=None, sites_dir=str(sites_dir), max_expansions=2,
                    fetch_private_addresses=True) as server:
        api = Client(server.url, None)
        for seed_id in ("a", "b"):
            status, _, body = api.call("POST", "/dispatch",
                                       sitemap(seed_id, f"{site.url}/slow.xml"))
            assert status == 202 and body["seeds"][0]["state"] == "expanding"
        wait_for(lambda: site.drips_started == 2)
        # Full: a request that would start one more is refused whole, nothing registered.
        status, headers, body = api.call("POST", "/dispatch", {"seeds": [
            sitemap("c", f"{site.url}/slow.xml"),
            {"seed_id": "d", "site_id": "open", "task_type": "url_list",
             "payload": {"urls": ["https://open.example/"]}}]})
        assert status == 503 and headers["Retry-After"] == str(RETRY_AFTER_S)
        assert "above the limit of 2" in body["detail"]
        assert api.call("GET", "/seeds/c")[0] == 404
        assert api.call("GET", "/seeds/d")[0] == 404
        # Inline url_list seeds take no slot; the rest of the API answers meanwhile.
        status, _, body = api.call("POST", "/dispatch", {
            "seed_id": "e", "site_id": "open", "task_type": "url_list",
            "payload": {"urls": ["https://open.example/1"]}})
        assert status == 202 and body["enqueued"] == 1
        for path in ("/status", "/dead-letters", "/seeds"):
            assert api.call("GET", path)[0] == 200
        # Deleting a seed stops its expansion, its fetch included, and frees its slot.
        status, _, body = api.call("DELETE", "/seeds/a")
        assert status == 200 and body["expansion_cancelled"] is True
        wait_for(lambda: site.drips_ended >= 1)
        status, _, _ = api.call("POST", "/dispatch", sitemap("c", f"{site.url}/slow.xml"))
        assert status == 202
        wait_for(lambda: site.drips_started == 3)
    wait_for(lambda: site.drips_ended == 3)  # stopping the server stopped the other fetches
