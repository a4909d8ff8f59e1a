"""Tasks belong to a spider (issue 26 point 5): the ``spider`` field of seeds and exec tasks (a
trust boundary: refused with the field named), the per-spider task sets of the key layout, and
against a real Redis the writer, the consumer's read, children, deferral, requeue, take-over
and status (the end-to-end crawl: tests/test_e2e_spider_sets.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request, Spider

from meteorseed_scrapy.api.dispatch import validate_seed
from meteorseed_scrapy.api.problems import InvalidInput
from meteorseed_scrapy.cli import main
from meteorseed_scrapy.queue.consume import deadletters
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.delayed_set import DelayedSet
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.liveness import Heartbeat, Liveness
from meteorseed_scrapy.queue.fleet.spiders import worker_spider
from meteorseed_scrapy.queue.inspect.status import read_status
from meteorseed_scrapy.queue.keys import KeyLayout, own_key
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import SPIDER_MAX, TaskError, check_spider
from meteorseed_scrapy.testing.clients import run_with_client
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.worker.requests import request_to_task
from tests.api_helpers import ApiServer, Client, url_list
from tests.queue_helpers import ack
from tests.test_migrate_cli import seed_expand

GOOD = ["shop", "quotes-toscrape", "example.com", "news_2", "ünïcode_spider", "商店",
        "a" * SPIDER_MAX]
#: Named nasty cases: each must be refused naming the field, never stored or shortened.
NASTY: list[Any] = ["", ":", "shop:eu", "shop\n", "\nshop", "sh op", "shop\t", "{shop}",
                    "a" * (SPIDER_MAX + 1), "shop\x00", "\u200bshop", "shop\u2028", "\ud800",
                    "shop/..", "*", "shop|x", 5, True, ["shop"], {"name": "shop"}, 1.5]


def task(n: int = 0, spider: str | None = None, site: str = "news", **kw: Any) -> ExecTask:
    return ExecTask.create(seed_id="s1", site_id=site, url=f"https://{site}.example/p/{n}",
                           spider=spider, **kw)


def seed(**extra: Any) -> dict[str, Any]:
    return {"seed_id": "s1", "site_id": "shop", "task_type": "url_list",
            "payload": {"urls": ["https://shop.example/a"]}, **extra}


# -- the field: a trust boundary -----------------------------------------------------------------


@pytest.mark.parametrize("name", GOOD)
def test_spider_names_a_scrapy_user_gives_are_carried(name: str) -> None:
    t = task(spider=name)
    back = ExecTask.from_message(t.to_message())
    assert back == t and back.spider == name
    assert SeedTask.from_dict(seed(spider=name)).exec_task("https://shop.example/a").spider == name


@pytest.mark.parametrize("name", NASTY)
def test_a_malformed_spider_name_is_refused_with_the_field_named(name: Any) -> None:
    with pytest.raises(TaskError) as exc:
        task(spider=name)
    assert exc.value.field == "spider"
    with pytest.raises(TaskError) as exc:
        SeedTask.from_dict(seed(spider=name))
    assert exc.value.field == "spider"
    # Arriving in a stream message (another writer, by hand): refused by the decoder too.
    data = {**task().to_dict(), "spider": name}
    with pytest.raises(TaskError) as exc:
        ExecTask.from_message({"v": "1", "t": json.dumps(data)})
    assert exc.value.field == "spider"


@pytest.mark.parametrize("name", NASTY)
def test_seed_expand_and_dispatch_name_the_field(name: Any) -> None:
    line = json.dumps(seed(spider=name))
    surrogate = name == "\ud800"  # (refused as such for any field, before the seed's checks)
    with pytest.raises(SeedLineError) as exc:
        parse_seed_line(line, 7)
    assert exc.value.lineno == 7
    assert exc.value.reason.startswith("holds an unpaired surrogate" if surrogate else "spider: ")
    with pytest.raises(InvalidInput) as refused:
        validate_seed(seed(spider=name), "seeds[2].")
    assert [e.field for e in refused.value.errors] == [
        "seeds[2]" if surrogate else "seeds[2].spider"]


@given(st.one_of(st.text(max_size=SPIDER_MAX + 20), st.none(), st.integers()))
def test_any_spider_value_is_carried_exactly_or_refused_naming_the_field(value: Any) -> None:
    try:
        t = task(spider=value)
    except TaskError as exc:
        assert exc.field == "spider"
        return
    assert ExecTask.from_message(t.to_message()).spider == value
    if value is not None:  # a valid name is one key segment of its own set, nothing more
        assert check_spider(value) == value
        assert not any(c in value for c in ":{} \n\t|*") and len(value) <= SPIDER_MAX
        stream = KeyLayout("ns").stream_for("scheduled", 0, value)
        assert stream == f"ns:spider:{value}:tasks" and stream.split(":")[2] == value


def test_a_message_without_the_field_keeps_working_and_stays_the_same() -> None:
    old = '{"task_id":"t1","seed_id":"s1","site_id":"news","url":"https://news.example/"' \
          ',"created_at":1.0}'
    t = ExecTask.from_message({"v": "1", "t": old})
    assert t.spider is None
    assert t.to_message()["t"] == old  # (a task that names no spider encodes as before)


def test_a_seeds_fast_path_tasks_carry_the_spider_in_the_same_json() -> None:
    s = SeedTask.from_dict(seed(spider="shop"))
    make = s.exec_task_factory()
    assert make is not None
    fast = make("https://shop.example/b")
    assert fast.spider == "shop"
    assert json.loads(fast.to_message()["t"]) == fast.to_dict()
    assert ExecTask.from_message(fast.to_message()) == fast


# -- the key layout ------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 3])
def test_each_spider_has_its_own_task_set_in_its_shards_slot(shards: int) -> None:
    keys = KeyLayout("ns", shards).with_spiders(["shop", "news", "shop"])
    assert keys.spiders == ("news", "shop")
    for shard in keys.shard_keys:
        assert len(shard.streams) == 9 * 3 == 3 * shard.streams_per_lane
        assert len(set(shard.streams)) == len(shard.streams)
        assert shard.delayeds[1:] == (shard.delayed_of("news"), shard.delayed_of("shop"))
        for stream in shard.streams:
            assert own_key("ns", stream) and not own_key("n", stream)
            assert stream.startswith(shard.prefix + ":")  # (same hash tag when tagged)
            spider = keys.stream_spiders[stream]
            assert (f":spider:{spider}:" in stream) == bool(spider)
    assert KeyLayout("ns").stream_for("realtime", 5, "shop") == "ns:spider:shop:tasks:realtime:high"
    assert own_key("ns", KeyLayout("ns").spiders_key)
    assert own_key("ns", KeyLayout("ns").spider_workers)
    with pytest.raises(TaskError):
        KeyLayout("ns").with_spiders(["a:b"])


# -- against a real Redis --------------------------------------------------------------------------


def _streams_with_entries(r: redis.Redis, keys: KeyLayout) -> dict[str, int]:
    return {s: n for s in keys.streams if (n := int(r.xlen(s)))}


def test_writer_routes_each_task_to_its_set_and_lists_the_spider_first(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    tasks = [task(1, "shop"), task(2, "shop", priority=3), task(3, None), task(4, "news")]
    run_with_client(redis_url, lambda c: TaskWriter(c, keys).add(tasks))
    everything = keys.with_spiders(["shop", "news"])
    assert _streams_with_entries(sync_redis, everything) == {
        f"{namespace}:spider:shop:tasks": 1, f"{namespace}:spider:shop:tasks:scheduled:high": 1,
        f"{namespace}:tasks": 1, f"{namespace}:spider:news:tasks": 1}
    assert sync_redis.smembers(keys.spiders_key) == {"shop", "news"}
    # Counted in the shard's counter, as every task stream's (status's throughput).
    assert sync_redis.hget(keys.only.counts, "added") == "4"
    assert sync_redis.keys(f"{namespace}:spider:*:counts") == []


@pytest.mark.parametrize("shards", [1, 2])
def test_a_worker_reads_its_own_and_unnamed_tasks_never_anothers(
        redis_url: str, namespace: str, sync_redis: redis.Redis, shards: int) -> None:
    keys = KeyLayout(namespace, shards)
    mine = [task(n, "shop", site=f"site{n}") for n in range(6)]
    free = [task(n + 10, None, site=f"site{n}") for n in range(6)]
    theirs = [task(n + 20, "news", site=f"site{n}") for n in range(6)]

    async def body(client: Any) -> list[ExecTask]:
        await TaskWriter(client, keys).add([*theirs, *mine, *free])
        consumer = StreamConsumer(client, keys.with_spiders(["shop"]), "w-shop", spider="shop")
        await consumer.ensure_group()
        got: list[ExecTask] = []
        for _ in range(5):  # more reads than needed: the other set is never reached
            got += [d.task for d in await consumer.read(50, 10) if d.task is not None]
        return got

    got = run_with_client(redis_url, body)
    assert sorted(t.task_id for t in got) == sorted(t.task_id for t in [*mine, *free])
    news = keys.with_spiders(["news"])
    for shard in news.shard_keys:  # the news set was not even read: no group, nothing pending
        for stream in shard.set_streams("news"):
            assert not sync_redis.exists(stream) or sync_redis.xinfo_groups(stream) == []
    assert sync_redis.hget(keys.spider_workers, "w-shop") == "shop"


def test_children_inherit_their_parents_spider_and_start_requests_their_spiders() -> None:
    class Shop(Spider):
        name = "shop"

    class Odd(Spider):
        name = "my spider"  # (not a set's name: its own requests name none)
        site_id = "odd"

    parent = task(1, "news")
    child = request_to_task(Request("https://news.example/c"), Shop(), parent)
    assert child.spider == "news"
    assert request_to_task(Request("https://news.example/c"), Shop(), task(1)).spider is None
    assert request_to_task(Request("https://shop.example/"), Shop(), None).spider == "shop"
    assert request_to_task(Request("https://shop.example/"), Odd(), None).spider is None


def test_a_deferred_task_comes_back_to_its_own_set_by_its_spiders_workers_only(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    shop_keys, news_keys = keys.with_spiders(["shop"]), keys.with_spiders(["news"])
    t = task(1, "shop")

    async def body(client: Any) -> None:
        await TaskWriter(client, keys).add([t])
        consumer = StreamConsumer(client, shop_keys, "w-shop", spider="shop")
        await consumer.ensure_group()
        [delivery] = await consumer.read(10, 10)

        def gate(k: KeyLayout) -> DelayedSet:
            return DelayedSet(client, k)

        assert await gate(shop_keys).defer(delivery.ref, t, 0)
        await gate(news_keys).promote()  # another spider's worker: not its to move
        assert await client.zcard(shop_keys.only.delayed_of("shop")) == 1
        await gate(shop_keys).promote()

    run_with_client(redis_url, body)
    assert sync_redis.zcard(shop_keys.only.delayed_of("shop")) == 0
    assert sync_redis.zcard(keys.delayed) == 0
    [(_, fields)] = sync_redis.xrange(f"{namespace}:spider:shop:tasks")
    assert ExecTask.from_message(fields).task_id == t.task_id


def test_a_requeued_dead_letter_goes_back_to_its_spiders_set(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    t = task(1, "shop")
    sync_redis.xadd(keys.dead, {"t": t.to_message()["t"], "reason": "HTTP 500",
                                "source_id": "1-0", "consumer": "w", "at": "1",
                                "deliveries": "6"})
    letters = list(deadletters.iter_dead(sync_redis, keys))
    out = io.StringIO()
    assert main(["dead", "show", letters[0].id, "--redis-url", redis_url, "--namespace",
                 namespace], stdout=out, stderr=io.StringIO()) == 0
    assert "spider:      shop" in out.getvalue()
    result = deadletters.requeue(sync_redis, keys, letters)
    assert len(result.requeued) == 1
    assert sync_redis.xlen(f"{namespace}:spider:shop:tasks") == 1
    assert sync_redis.xlen(keys.stream) == 0
    assert sync_redis.smembers(keys.spiders_key) == {"shop"}


def test_a_dead_worker_of_another_spider_is_left_to_its_own_spiders_workers(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """A survivor takes the dead worker's unnamed tasks, but cannot see those of its spider's
    set: it keeps it listed, so that a worker of that spider takes the rest at once."""
    keys = KeyLayout(namespace)
    news_keys, shop_keys = keys.with_spiders(["news"]), keys.with_spiders(["shop"])

    async def hold(client: Any) -> None:
        await TaskWriter(client, keys).add([task(1, None), task(2, "news")])
        dead = StreamConsumer(client, news_keys, "dead", spider="news")
        await dead.ensure_group()
        assert len(await dead.read(10, 10)) == 2
        await StreamConsumer(client, shop_keys, "w-shop", spider="shop").ensure_group()
        await StreamConsumer(client, news_keys, "w-news", spider="news").ensure_group()

    run_with_client(redis_url, hold)
    for name in ("dead", "w-shop", "w-news"):
        assert Heartbeat(sync_redis, keys, name).beat(3600)
    sync_redis.zadd(keys.workers, {"dead": 1})  # its liveness lapsed

    def take_over(k: KeyLayout, name: str, spider: str) -> list[str]:
        async def body(client: Any) -> list[str]:
            live = Liveness(client, k, name, 0.5)
            dead = await live.dead()
            got, holding = await StreamConsumer(client, k, name, spider=spider
                                                ).reclaim_from(dead, 10)
            await live.settle(dead, holding)
            return [d.task.url for d in got if d.task is not None]
        result: list[str] = run_with_client(redis_url, body)
        return result

    assert take_over(shop_keys, "w-shop", "shop") == ["https://news.example/p/1"]
    assert sync_redis.zscore(keys.workers, "dead") is not None  # still listed
    assert take_over(news_keys, "w-news", "news") == ["https://news.example/p/2"]
    assert sync_redis.zscore(keys.workers, "dead") is None


def test_status_shows_the_backlog_per_spider_and_sets_no_worker_runs(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    tasks = [task(1, "shop"), task(2, "shop"), task(3, None), task(4, "news")]
    run_with_client(redis_url, lambda c: TaskWriter(c, keys).add(tasks))

    async def start(client: Any) -> None:
        consumer = StreamConsumer(client, keys.with_spiders(["shop"]), "w-shop", spider="shop")
        await consumer.ensure_group()
        assert len(await consumer.read(1, 10)) == 1  # (the unnamed one, read first)

    run_with_client(redis_url, start)
    assert Heartbeat(sync_redis, keys, "w-shop").beat(3600)
    status = read_status(sync_redis, keys)
    rows = {sp.spider: sp for sp in status.spiders}
    assert (rows[None].backlog, rows[None].pending, rows[None].workers) == (0, 1, 1)
    assert (rows["shop"].backlog, rows["shop"].workers, rows["shop"].unserved) == (2, 1, False)
    assert (rows["news"].backlog, rows["news"].workers, rows["news"].unserved) == (1, 0, True)
    assert status.backlog == 3 and status.pending == 1
    assert status.to_json()["spiders"][2] == {"spider": "shop", "backlog": 2, "pending": 0,
                                              "delayed": 0, "workers": 1, "unserved": False}
    out = io.StringIO()
    assert main(["status", "--redis-url", redis_url, "--namespace", namespace],
                stdout=out, stderr=io.StringIO()) == 0
    text = out.getvalue()
    assert "(any: names no spider)" in text
    assert [line.split()[0] for line in text.splitlines()
            if "waiting: no live worker runs this spider" in line] == ["news"]
    # A lookup finds a task in its spider's set.
    out = io.StringIO()
    assert main(["task", tasks[3].task_id, "--redis-url", redis_url, "--namespace", namespace,
                 "--json"], stdout=out, stderr=io.StringIO()) == 0
    assert json.loads(out.getvalue())["places"][0]["stream"] == f"{namespace}:spider:news:tasks"


# -- the field flows through every way in ----------------------------------------------------------


def test_seed_expand_puts_a_named_seeds_tasks_in_its_spiders_set(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    lines = [seed(seed_id="a", spider="shop"), seed(seed_id="b"),
             seed(seed_id="c", spider="shop:eu")]
    lines[1]["payload"] = {"urls": ["https://shop.example/free"]}
    (tmp_path / "seeds.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = seed_expand(tmp_path, "seeds.jsonl", "-s", f"METEORSEED_REDIS_URL={redis_url}",
                       "-s", f"METEORSEED_NAMESPACE={namespace}")
    assert proc.returncode != 0  # (line 3 was rejected)
    assert "line 3" in proc.stderr and "spider: must be a spider's name" in proc.stderr
    keys = KeyLayout(namespace)
    [(_, fields)] = sync_redis.xrange(keys.stream_for("scheduled", 0, "shop"))
    assert ExecTask.from_message(fields).url == "https://shop.example/a"
    [(_, fields)] = sync_redis.xrange(keys.stream)
    assert ExecTask.from_message(fields).spider is None


@pytest.fixture
def api(api_server: ApiServer, tmp_path: Path) -> Iterator[Client]:
    with api_server(sites_dir=str(tmp_path)) as running:
        yield Client(running.url)


def test_dispatch_puts_a_named_seeds_tasks_in_its_spiders_realtime_set(
        api: Client, sync_redis: redis.Redis, namespace: str) -> None:
    status, _, body = api.call("POST", "/dispatch", {"seeds": [
        url_list("d1", ["https://news.example/a"], spider="news_spider")]})
    assert status in (200, 201, 202), body
    keys = KeyLayout(namespace)
    stream = keys.stream_for("realtime", 0, "news_spider")
    wait_for(lambda: sync_redis.xlen(stream) == 1, timeout=30)
    [(_, fields)] = sync_redis.xrange(stream)
    assert ExecTask.from_message(fields).spider == "news_spider"
    status, _, body = api.call("GET", "/status")
    assert status == 200 and stream in body["streams"]
    assert body["spiders"][1] == {"spider": "news_spider", "backlog": 1, "pending": 0,
                                  "delayed": 0, "workers": 0, "unserved": True}
    status, _, body = api.call("POST", "/dispatch", {"seeds": [
        url_list("d2", ["https://news.example/b"], spider="news spider")]})
    assert status == 422
    assert [e["field"] for e in body["errors"]] == ["seeds[0].spider"]


def test_a_registered_seed_keeps_its_spider(redis_url: str, namespace: str) -> None:
    async def body(client: Any) -> str | None:
        registry = SeedRegistry(client, KeyLayout(namespace))
        await registry.put(SeedTask.from_dict(seed(spider="shop", schedule="every 1h")))
        record = await registry.get("s1")
        assert record is not None
        return record.seed.spider

    assert run_with_client(redis_url, body) == "shop"


def test_pruning_forgets_its_own_spiders_workers_and_leaves_anothers(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    """A long-gone consumer of another spider may still hold tasks of its set: its entry in
    <ns>:spiders:workers stays, so that take-over keeps leaving it to its own spider."""
    keys = KeyLayout(namespace)
    shop_keys, news_keys = keys.with_spiders(["shop"]), keys.with_spiders(["news"])

    async def body(client: Any) -> list[str]:
        for n, (name, k, spider) in enumerate((("old-shop", shop_keys, "shop"),
                                               ("old-news", news_keys, "news"),
                                               ("me", shop_keys, "shop"))):
            await TaskWriter(client, keys).add([task(n)])
            consumer = StreamConsumer(client, k, name, spider=spider)
            await consumer.ensure_group()
            [delivery] = await consumer.read(10, 0)  # (listed in the default stream)
            assert await ack(consumer, [delivery.ref]) == 1
        await client.hset(keys.spider_workers, "ghost", "shop")  # (never in a stream)
        wait_for(lambda: all(c["idle"] > 100 for c in sync_redis.xinfo_consumers(
            keys.stream, "workers") if c["name"] != "me"), timeout=10, interval=0.02)
        return await StreamConsumer(client, shop_keys, "me", spider="shop"
                                    ).membership().prune(0.05)

    assert run_with_client(redis_url, body) == ["old-news", "old-shop"]
    assert sync_redis.hgetall(keys.spider_workers) == {"old-news": "news", "me": "shop",
                                                       "ghost": "shop"}


def test_a_spider_whose_name_cannot_name_a_set_reads_the_default_set_and_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    assert worker_spider("shop") == "shop"
    with caplog.at_level(logging.WARNING):
        assert worker_spider("my spider") is None
    assert "Spider name 'my spider' cannot name a task set" in caplog.text
    assert "takes only tasks that name no spider" in caplog.text
