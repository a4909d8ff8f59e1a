"""The crawl-events stream ``<ns>:events`` (queue/fleet/events.py): the entry format other programs
read, its bound, and reading it with a consumer group of one's own (docs/events.md)."""

from __future__ import annotations

import asyncio
import json

import redis
import redis.asyncio

from meteorseed_scrapy.queue.fleet import events
from meteorseed_scrapy.queue.fleet.events import EVENTS_KEPT, CrawlEvent, EventReader
from meteorseed_scrapy.queue.keys import KeyLayout


def test_an_event_is_flat_text_with_json_for_the_rest(sync_redis: redis.Redis,
                                                      namespace: str) -> None:
    stream = KeyLayout(namespace).events
    events.append(sync_redis, stream, CrawlEvent.FINISHED, seed="s1",
                  counters={"done": 2, "dead": 0}, none=None)
    events.append(sync_redis, stream, "site paused", site="news", by="ops", reason="429s")
    [(_i, first), (_j, second)] = sync_redis.xrange(stream)
    assert set(first) == {"event", "at", "seed", "counters"}  # a None is left out
    assert first["event"] == "finished" and json.loads(first["counters"]) == {"done": 2,
                                                                              "dead": 0}
    assert abs(float(first["at"]) - float(second["at"])) < 60 and "." in first["at"]
    assert second == {**second, "event": "site paused", "site": "news", "reason": "429s"}


def test_the_stream_is_capped(sync_redis: redis.Redis, namespace: str) -> None:
    stream = KeyLayout(namespace).events
    pipe = sync_redis.pipeline(transaction=False)
    for i in range(EVENTS_KEPT + 500):
        pipe.xadd(stream, events.entry(CrawlEvent.STARTED, {"seed": f"s{i}"}))
    pipe.execute()
    events.append(sync_redis, stream, CrawlEvent.STARTED, seed="last")
    assert sync_redis.xlen(stream) < EVENTS_KEPT + 500  # MAXLEN ~: whole nodes trimmed


def test_two_groups_each_read_every_event_and_a_stopped_reader_is_taken_over(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    stream = KeyLayout(namespace).events

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            mine = EventReader(client, stream, "mine", "a")
            assert await mine.create_group("0") is True  # MKSTREAM: no stream needed yet
            assert await mine.create_group("0") is False
            other = EventReader(client, stream, "other", "x")
            await other.create_group("$")
            ids = [await events.append_async(client, stream, CrawlEvent.STARTED, seed=s)
                   for s in ("s1", "s2")]
            read = await mine.read(10, 100)
            assert [(e.id, e.event, e.fields["seed"]) for e in read] == [
                (ids[0], "started", "s1"), (ids[1], "started", "s2")]
            assert [e.id for e in await other.read(10, 100)] == ids  # its own copy
            await mine.ack(ids[0])
            # "a" stops holding s2 unacknowledged: "b" of the same group takes it over.
            taker = EventReader(client, stream, "mine", "b")
            claimed, gone = await taker.claim(0.0, 10)
            assert ([e.id for e in claimed], gone) == ([ids[1]], [])
            await taker.ack(ids[1])
            assert (await client.xpending(stream, "mine"))["pending"] == 0
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_pending_event_trimmed_away_is_reported_gone(redis_url: str, namespace: str,
                                                       sync_redis: redis.Redis) -> None:
    stream = KeyLayout(namespace).events

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            reader = EventReader(client, stream, "g", "a")
            await reader.create_group("0")
            entry = await events.append_async(client, stream, CrawlEvent.STARTED, seed="s")
            await reader.read(1, 100)
            await client.xdel(stream, entry)
            claimed, gone = await EventReader(client, stream, "g", "b").claim(0.0, 10)
            major = int(str((await client.info("server"))["redis_version"]).split(".")[0])
            # (Redis 6.2 answers nil without the id: nothing to acknowledge, nothing handled)
            assert (claimed, gone) == ([], [entry] if major >= 7 else [])
        finally:
            await client.aclose()

    asyncio.run(main())
