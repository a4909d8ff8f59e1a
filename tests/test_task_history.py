"""The task history against a real Redis: a crawl of a local site whose pages give items, 404,
are disallowed by robots.txt or blacklisted, then ``meteorseed task URL`` for each; records
gone after the retention (Redis TIME), the per-site bound, the settings' validation."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st
from scrapy.settings import Settings

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.queue.consume.task_history import (
    BATCH,
    CODES,
    HistoryEntry,
    HistoryQueue,
    TaskHistory,
    decode_record,
    outcome_name,
)
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.scripts import script_source
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.testing.loopback import LoopbackHandler, LoopbackSite
from meteorseed_scrapy.testing.polling import wait_for
from meteorseed_scrapy.validators import ConfigError
from tests.e2e_helpers import enqueue, start_worker

SITE = "hist"
RULES = """site_id: hist
version: 1
list: {links: {css: 'a', attr: href}}
fields:
  title: {css: 'title::text'}
blacklist: ['/banned']
"""


class _Handler(LoopbackHandler):
    def serve(self, head: bool = False) -> None:
        if self.path == "/robots.txt":
            self.send_page(200, "text/plain", b"User-agent: *\nDisallow: /private\n", {}, head)
        elif self.path.startswith("/gone"):
            self.send_page(404, "text/html", b"<html>no such page</html>", {}, head)
        else:
            body = f"<html><head><title>{self.path}</title></head><body>ok</body></html>"
            self.send_page(200, "text/html", body.encode(), {}, head)


class HistorySite(LoopbackSite):
    handler = _Handler
    thread_name = "history-site"


def lookup(redis_url: str, namespace: str, url: str) -> tuple[dict[str, Any], str]:
    """``meteorseed task URL --site hist``: its JSON answer and its text."""
    answers = []
    for extra in (["--json"], []):
        out = io.StringIO()
        main(["task", "--redis-url", redis_url, "--namespace", namespace, url, "--site", SITE,
              *extra], stdin=io.StringIO(), stdout=out, stderr=io.StringIO())
        answers.append(out.getvalue())
    return json.loads(answers[0]), answers[1]


def test_a_crawl_leaves_each_urls_outcome_when_and_by_whom(
        tmp_path: Path, redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "hist.yaml").write_text(RULES)
    with HistorySite() as site:
        urls = {"done": f"{site.url}/page?many=3", "gone": f"{site.url}/gone/1",
                "robots": f"{site.url}/private/2", "blacklisted": f"{site.url}/banned/3",
                "dead": f"{site.url}/page?boom=1"}
        enqueue(redis_url, namespace, urls.values(), site_id=SITE)
        worker = start_worker(tmp_path, redis_url, namespace, name="hist-w1",
                              ROBOTSTXT_OBEY=True, METEORSEED_SITES_DIR=str(sites))
        assert worker.wait() == 0, worker.log()[-3000:]
    secs = int(sync_redis.time()[0])
    for outcome, url in urls.items():
        body, text = lookup(redis_url, namespace, url)
        assert body["state"] == outcome, (url, body)
        (row,) = body["history"]
        assert row["consumer"] == "hist-w1" and secs - 120 <= row["at"] <= secs + 1
        assert "by consumer hist-w1" in text and f"state:         {outcome}" in text
    done, text = lookup(redis_url, namespace, urls["done"])
    assert done["history"][0]["items"] == 3 and "done (3 item(s), HTTP 200)" in text
    gone, _ = lookup(redis_url, namespace, urls["gone"])
    assert gone["history"][0]["status"] == 404
    dead, _ = lookup(redis_url, namespace, urls["dead"])  # (its dead letter is there too)
    assert dead["history"][0]["reason"] and "boom" in dead["places"][0]["reason"]
    # A URL never crawled has no history.
    body, _ = lookup(redis_url, namespace, f"{site.url}/never")
    assert body["history"] == [] and body["state"] == "not found"
    # Nothing per task is left once the completion records are gone (they expire after
    # METEORSEED_DONE_TTL): the dedup buckets and the history buckets, shared by many URLs.
    keys = [k for k in sync_redis.scan_iter(f"{namespace}:*")
            if ":done:" not in k and ":failed:" not in k]
    per_url = [k for k in keys if any(u.split("//", 1)[1] in k for u in urls.values())]
    assert per_url == []
    hist = [k for k in keys if k.startswith(f"{namespace}:hist:")]
    assert hist and all(sync_redis.ttl(k) > 0 for k in hist)


def entries(n: int, consumer: str = "w1", start: int = 0) -> list[HistoryEntry]:
    out = []
    for i in range(start, start + n):
        task = ExecTask.create(seed_id="s", site_id=SITE, url=f"https://hist.test/{i}")
        fp = hashlib.sha256(task.url.encode()).digest()[:16]
        out.append(HistoryEntry.of(task, fp, "done", consumer, items=i % 7, status=200))
    return out


async def _get(client: aioredis.Redis, keys: KeyLayout, entry: HistoryEntry
               ) -> dict[str, Any] | None:
    reply = await client.eval(script_source("history_get"), 1, keys.history(SITE),
                              entry.fingerprint)
    return decode_record(reply)


def test_records_are_gone_after_the_retention(redis_url: str, namespace: str,
                                              sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)

    async def write_and_read() -> list[dict[str, Any] | None]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            some = entries(200)
            assert await TaskHistory(client, keys, 2, 1000).write(some) == 200
            return [await _get(client, keys, e) for e in some]
        finally:
            await client.aclose()

    found = asyncio.run(write_and_read())
    assert all(r is not None and r["outcome"] == "done" for r in found)
    assert [r["items"] for r in found if r] == [i % 7 for i in range(200)]
    # Every key has an expiry (Redis TIME): all gone within retention + a generation.
    pattern = f"{namespace}:hist:*"
    assert all(sync_redis.pttl(k) > 0 for k in sync_redis.scan_iter(pattern))
    wait_for(lambda: not list(sync_redis.scan_iter(pattern)), 10, 0.05)


def test_a_site_keeps_at_most_its_bound_newest_first(redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)

    async def run() -> tuple[list[Any], int]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            history = TaskHistory(client, keys, 86400, 400)
            written = entries(3000)
            for i in range(0, 3000, 250):  # (several calls, as workers' flushes)
                await history.write(written[i:i + 250])
            found = [await _get(client, keys, e) for e in written]
            kept = sum(1 for r in found if r is not None)
            return found, kept
        finally:
            await client.aclose()

    found, kept = asyncio.run(run())
    # The bound, give or take one generation's share (bound / 4) while it fills.
    assert 400 <= kept <= 400 + 100
    assert all(r is not None for r in found[-400:])  # the newest are kept
    assert all(r is None for r in found[:2000])


def test_the_newest_outcome_of_a_url_replaces_the_last(redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    task = ExecTask.create(seed_id="s", site_id=SITE, url="https://hist.test/again")
    fp = hashlib.sha256(b"again").digest()[:16]

    async def run() -> dict[str, Any] | None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            history = TaskHistory(client, keys, 86400, 100)
            await history.write([HistoryEntry.of(task, fp, "done", "w1", items=2)])
            reason = "HTTP 503 after 4 retries, and a long tail ééé" * 3
            await history.write([HistoryEntry.of(task, fp, "dead", "w,2", reason=reason)])
            return await _get(client, keys, HistoryEntry.of(task, fp, "done", "w1"))
        finally:
            await client.aclose()

    record = asyncio.run(run())
    assert record is not None and record["outcome"] == "dead" and record["consumer"] == "w,2"
    assert record["reason"].startswith("HTTP 503 after 4 retries, and a")
    assert len(record["reason"].encode()) <= 40


@pytest.mark.parametrize(("outcome", "reason", "name"), [
    ("done", "", "done"), ("gone", "HTTP 404", "gone"),
    ("ignored", "ignored: Forbidden by robots.txt", "robots"),
    ("ignored", "ignored: blacklisted by site hist: pattern '/banned'", "blacklisted"),
    ("ignored", "ignored: offsite", "ignored"), ("dead", "HTTP 500", "dead"),
    # Another reason quoting a URL that holds either word is no robots or blacklist verdict.
    ("ignored", "ignored: private address of https://x.test/robots.txt", "ignored"),
    ("ignored", "ignored: Forbidden by robots.txt, says my spider", "ignored"),
    ("ignored", "ignored: max redirections reached at https://x.test/blacklisted", "ignored"),
    ("dead", "ignored: Forbidden by robots.txt", "dead")])
def test_outcome_names(outcome: str, reason: str, name: str) -> None:
    assert outcome_name(outcome, reason) == name


@pytest.mark.parametrize(("name", "value"), [
    ("METEORSEED_TASK_HISTORY_RETENTION", "-1"), ("METEORSEED_TASK_HISTORY_RETENTION", "soon"),
    ("METEORSEED_TASK_HISTORY_PER_SITE", "0"), ("METEORSEED_TASK_HISTORY_PER_SITE", "x")])
def test_bad_settings_are_refused_naming_them(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        TaskHistory.settings_of(Settings({name: value}))


@pytest.mark.parametrize("reply", [None, [], ["", "0", ""], ["q1,2,3,1", "0", "w"],
                                   ["d1,2", "0", "w"], ["dx,2,3,1", "0", "w"], [b"\xff", 0, 0]])
def test_an_unreadable_record_is_none(reply: Any) -> None:
    assert decode_record(reply) is None


def test_a_cancelled_task_reads_as_cancelled(redis_url: str, namespace: str) -> None:
    # (what a seed's cancel writes for each task it removes: HistoryEntry "cancelled")
    url = "https://hist.test/cancelled?b=1&a=2"
    task = ExecTask.create(seed_id="s", site_id=SITE, url=url)

    async def write() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            writer = TaskWriter(client, KeyLayout(namespace))
            entry = HistoryEntry.of(task, writer.fingerprint(task), "cancelled", "ops@host",
                                    reason="seed s cancelled")
            await TaskHistory(client, KeyLayout(namespace), 86400, 100).write([entry])
        finally:
            await client.aclose()

    asyncio.run(write())
    body, text = lookup(redis_url, namespace, "https://hist.test/cancelled?a=2&b=1")
    assert body["state"] == "cancelled" and body["history"][0]["reason"] == "seed s cancelled"
    assert "cancelled (seed s cancelled) at " in text and "by consumer ops@host" in text


def test_a_workers_queue_writes_full_batches_and_skips_what_it_cannot_record(
        redis_url: str, namespace: str) -> None:
    keyless = ExecTask.create(seed_id="s", site_id=SITE, url="https://hist.test/keyless")
    tasks = [ExecTask.create(seed_id="s", site_id=SITE, url=f"https://hist.test/q{i}")
             for i in range(BATCH + 1)]

    async def run() -> tuple[bool, bool, int, int]:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            writer = TaskWriter(client, KeyLayout(namespace))

            def fingerprint(task: ExecTask) -> bytes:
                if task is keyless:
                    raise ValueError("no dedup key")
                return writer.fingerprint(task)

            off = HistoryQueue(TaskHistory(client, KeyLayout(namespace), 0, 100), fingerprint,
                               "w1")
            off.add(tasks[0], "done")
            queue = HistoryQueue(TaskHistory(client, KeyLayout(namespace), 86400, 10_000),
                                 fingerprint, "w1")
            queue.add(keyless, "done")
            queue.add(tasks[0], "ignored", reason="ignored: Forbidden by robots.txt")
            one_due_closing = queue.due(closing=True)  # (a batch to fill: not otherwise)
            for task in tasks[1:]:
                queue.add(task, "done", items=1, status=200)
            full_due = queue.due(closing=False)
            await queue.write_batch()
            return one_due_closing, full_due, len(queue.ends), len(off.ends)
        finally:
            await client.aclose()

    assert asyncio.run(run()) == (True, True, 1, 0)
    body, _ = lookup(redis_url, namespace, "https://hist.test/q0")
    assert body["state"] == "robots" and body["history"][0]["consumer"] == "w1"
    assert lookup(redis_url, namespace, f"https://hist.test/q{BATCH}")[0]["history"] == []
    assert lookup(redis_url, namespace, "https://hist.test/keyless")[0]["history"] == []


@given(st.lists(st.one_of(st.binary(max_size=80), st.text(max_size=80), st.integers()),
                max_size=4))
def test_any_reply_decodes_to_a_record_or_none(reply: list[Any]) -> None:
    record = decode_record(reply)
    assert record is None or record["outcome"] in CODES
