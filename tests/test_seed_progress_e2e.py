"""End to end: seeds crawled by a real worker on the local demo site, then their progress and
items through ``meteorseed seeds show|list|items`` and ``GET /seeds/{id}[/items]``."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import redis

from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.testing.sites import DemoSite
from tests.api_helpers import ApiServer, Client
from tests.cli_helpers import cli
from tests.e2e_helpers import enqueue, start_worker

pytestmark = pytest.mark.e2e


def test_seeds_finish_with_their_counts_children_and_dead_letters_included(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis,
        demo_site: DemoSite, api_server: ApiServer) -> None:
    n = 6
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/{i}" for i in range(1, n + 1)],
            seed_id="plain")
    # Each parent yields two children (same seed): the seed ends only once they settle.
    enqueue(redis_url, namespace, [f"{demo_site.url}/news/article/{i}?kids=1&n=f"
                                   for i in (1, 2)], seed_id="family")
    enqueue(redis_url, namespace, [f"{demo_site.url}/status/500"], seed_id="broken")
    worker = start_worker(tmp_path, redis_url, namespace)
    assert worker.wait() == 0, worker.log()[-3000:]

    code, text, _ = cli(redis_url, namespace, "seeds", "show", "plain", "--json")
    assert code == 0, text
    plain = json.loads(text)["progress"]
    assert plain["state"] == "finished" and plain["finished_at"] >= plain["started_at"] > 0
    assert (plain["enqueued"], plain["done"], plain["dead"], plain["items"]) == (n, n, 0, n)
    assert plain["waiting"] == plain["delayed"] == 0 and plain["bytes"] > 0

    family = json.loads(cli(redis_url, namespace, "seeds", "show", "family", "--json")[1])
    assert family["progress"]["state"] == "finished"
    assert (family["progress"]["enqueued"], family["progress"]["done"]) == (6, 6)
    assert family["progress"]["items"] == 6

    broken = json.loads(cli(redis_url, namespace, "seeds", "show", "broken", "--json")[1])
    assert broken["progress"]["state"] == "finished"
    assert (broken["progress"]["dead"], broken["progress"]["done"]) == (1, 0)

    code, text, _ = cli(redis_url, namespace, "seeds", "show", "plain")
    assert code == 0 and "finished" in text and f"items:      {n}" in text

    # One 'finished' event per seed, with its final counters.
    finished = {fields["seed"]: json.loads(fields["counters"])
                for _, fields in sync_redis.xrange(KeyLayout(namespace).events)
                if fields["event"] == "finished"}
    assert set(finished) == {"plain", "family", "broken"}
    assert finished["plain"]["done"] == n

    store_uri = f"sqlite:///{tmp_path / 'items.db'}"
    code, text, _ = cli(redis_url, namespace, "seeds", "items", "plain", "--jsonl",
                     "--store-uri", store_uri)
    lines = [json.loads(line) for line in text.splitlines()]
    assert code == 0 and len(lines) == n and {d["seed_id"] for d in lines} == {"plain"}

    with api_server(token=None, store_uri=store_uri) as server:
        api = Client(server.url, None)
        status, _, answer = api.call("GET", "/seeds/plain")
        assert status == 200, answer
        assert answer["progress"]["done"] == n and answer["progress"]["state"] == "finished"
        ids, after = [], ""
        while True:
            status, _, page = api.call("GET", f"/seeds/plain/items?limit=4{after}")
            assert status == 200, page
            ids += [doc["_id"] for doc in page["items"]]
            if page["next"] is None:
                break
            after = f"&after={urllib.request.quote(page['next'])}"
        assert ids == sorted(doc["_id"] for doc in lines) and len(ids) == n
