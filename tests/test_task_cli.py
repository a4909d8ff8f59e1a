"""``meteorseed task URL|ID`` against a real Redis: the one answer for each state, JSON and text,
exit codes, and refusals naming the argument."""

from __future__ import annotations

import asyncio
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from w3lib.url import url_query_cleaner

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.cli.task import ENDED
from meteorseed_scrapy.queue.consume.task_history import CODES
from meteorseed_scrapy.queue.enqueue.writer import TaskWriter
from meteorseed_scrapy.queue.fleet.delayed import REASON_CODES, SCALE
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exceptions import DeferReason
from meteorseed_scrapy.task.exec_task import ExecTask


def run(redis_url: str, namespace: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["task", "--redis-url", redis_url, "--namespace", namespace, *argv],
                stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_waiting_task_by_id_and_url(redis_url: str, namespace: str,
                                    sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = ExecTask.create(seed_id="s1", site_id="news", url="https://news.test/a?b=1&a=2")
    sync_redis.xadd(keys.stream, one.to_message())
    code, out, err = run(redis_url, namespace, one.task_id)
    assert code == 0, err
    assert "state:         waiting" in out and "scheduled/normal" in out and "0 ahead" in out
    # The URL typed with its query in another order is the same canonical URL.
    code, out, _ = run(redis_url, namespace, "https://news.test/a?a=2&b=1", "--json")
    body = json.loads(out)
    assert code == 0 and body["state"] == "waiting"
    assert body["query"]["canonical_url"] == "https://news.test/a?a=2&b=1"
    assert body["places"][0]["task"]["task_id"] == one.task_id and body["exhaustive"]


def test_delayed_text_says_why_and_when(redis_url: str, namespace: str,
                                        sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = ExecTask.create(seed_id="s1", site_id="news", url="https://news.test/x")
    secs, _ = sync_redis.time()
    due = (secs + 600) * 1000
    score = due - 1 + REASON_CODES[DeferReason.SICK] / SCALE
    sync_redis.zadd(keys.delayed, {f"retry:normal|{one.to_message()['t']}": score})
    code, out, _ = run(redis_url, namespace, one.task_id)
    assert code == 0 and "delayed (sick)" in out and "then to retry/normal" in out
    assert "in 10m" in out or "in 9m" in out
    assert math.isfinite(score)


def test_not_found_is_exit_1_and_bad_input_names_the_argument(
        redis_url: str, namespace: str) -> None:
    code, out, _ = run(redis_url, namespace, "0" * 32)
    assert code == 1 and "state:         not found" in out
    assert "searched:" in out and "every one in full" in out
    code, _, err = run(redis_url, namespace, "ftp://x.test/")
    assert code == 2 and "argument URL|ID:" in err and "Traceback" not in err
    code, _, err = run(redis_url, namespace, "https://x.test/", "--site", "a b")
    assert code == 2 and "argument --site:" in err


def test_stored_text_is_escaped_on_the_terminal(redis_url: str, namespace: str,
                                                sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = ExecTask.create(seed_id="s1", site_id="news", url="https://news.test/\x1b[31m")
    sync_redis.xadd(keys.dead, {"t": one.to_message()["t"], "reason": "boom\x1b]0;x\x07",
                                "consumer": "w", "deliveries": "3", "at": "1"})
    code, out, _ = run(redis_url, namespace, one.task_id)
    assert code == 0 and "dead letter" in out and "boom" in out
    assert "\x1b" not in out and "\x07" not in out


class DropSid:
    """A project's REQUEST_FINGERPRINTER_CLASS: the ``sid`` parameter makes no new request."""

    def __init__(self, crawler: Any = None) -> None:
        self.scrapys = RequestFingerprinter(crawler)

    @classmethod
    def from_crawler(cls, crawler: Any) -> DropSid:
        return cls(crawler)

    def fingerprint(self, request: Request) -> bytes:
        url = url_query_cleaner(request.url, ["sid"], remove=True)
        return self.scrapys.fingerprint(request.replace(url=url))


def test_inside_a_project_urls_use_its_fingerprinter(
        redis_url: str, namespace: str, sync_redis: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = fpproject_settings\n")
    (tmp_path / "fpproject_settings.py").write_text(
        f"REQUEST_FINGERPRINTER_CLASS = '{__name__}.DropSid'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # Set, then removed: teardown then removes what Scrapy sets from scrapy.cfg (a bare delenv
    # of an unset variable records nothing, and the module leaked into later tests).
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "")
    monkeypatch.delenv("SCRAPY_SETTINGS_MODULE")
    keys = KeyLayout(namespace)
    one = ExecTask.create(seed_id="s1", site_id="news", url="https://news.test/a?sid=1")

    async def enqueue() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await TaskWriter(client, keys, fingerprinter=DropSid()).add([one])
        finally:
            await client.aclose()

    asyncio.run(enqueue())
    sync_redis.xtrim(keys.stream, maxlen=0)  # only the dedup record is left
    code, out, err = run(redis_url, namespace, "https://news.test/a?sid=2", "--site", "news",
                         "--json")
    body = json.loads(out)
    assert code == 0, err
    assert body["state"] == "deduplicated"
    assert body["query"]["dedup_keys"] == "REQUEST_FINGERPRINTER_CLASS"


def test_every_task_history_outcome_has_its_line() -> None:
    # A history outcome without one would print as its bare code name.
    assert set(ENDED) == set(CODES)
