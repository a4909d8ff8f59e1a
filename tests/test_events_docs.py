"""The examples of docs/events.md and docs/webhooks.md run as written (against a real Redis)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from meteorseed_scrapy.observability import webhook
from meteorseed_scrapy.queue.fleet import events
from meteorseed_scrapy.queue.fleet.events import CrawlEvent
from meteorseed_scrapy.queue.keys import KeyLayout

DOCS = Path(__file__).resolve().parents[1] / "docs"


def blocks(name: str, language: str) -> list[str]:
    text = (DOCS / name).read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def test_the_python_consumer_reads_finished_and_site_events(redis_url: str, namespace: str,
                                                            sync_redis: redis.Redis) -> None:
    [code] = blocks("events.md", "python")
    code = (code.replace("redis://127.0.0.1:6379/0", redis_url)
            .replace('"meteorseed:events"', repr(KeyLayout(namespace).events))
            .replace("while True:", "for _round in range(2):")
            .replace("block=5000", "block=100"))
    stream = KeyLayout(namespace).events
    printed: list[tuple[Any, ...]] = []
    scope: dict[str, Any] = {"print": lambda *args: printed.append(args)}
    exec(compile(code.replace("for _round in range(2):", "for _round in range(0):"),
                 "events.md", "exec"), scope)  # the group, created from now on
    events.append(sync_redis, stream, CrawlEvent.FINISHED, seed="s1", counters={"done": 2})
    events.append(sync_redis, stream, CrawlEvent.SITE_PAUSED, site="news", by="ops")
    exec(compile(code, "events.md", "exec"), scope)
    assert printed == [("s1", "finished:", {"done": 2}), ("news", "paused", "by", "ops")]
    assert sync_redis.xpending(stream, "my-tool")["pending"] == 0


@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="no redis-cli")
def test_the_redis_cli_lines_read_with_a_group(redis_url: str, namespace: str,
                                               sync_redis: redis.Redis) -> None:
    stream = KeyLayout(namespace).events
    port = sync_redis.connection_pool.connection_kwargs["port"]
    lines = [line for block in blocks("events.md", "sh") for line in block.splitlines()]
    outputs = []
    for index, line in enumerate(lines):
        if index == 1:
            events.append(sync_redis, stream, CrawlEvent.STARTED, seed="s9")
        args = [a.strip("'") for a in line.replace("meteorseed:events", stream).split()]
        outputs.append(subprocess.run([*args[:1], "-p", str(port), *args[1:]],
                                      capture_output=True, text=True, timeout=30,
                                      check=True).stdout)
    assert outputs[0].strip() == "OK" and "s9" in outputs[1] and "started" in outputs[1]


def test_the_receivers_check_accepts_a_call_and_refuses_a_forgery() -> None:
    [code] = blocks("webhooks.md", "python")
    scope: dict[str, Any] = {}
    exec(compile(code, "webhooks.md", "exec"), scope)
    body = json.dumps({"event": "finished", "seed_id": "s1"}).encode()
    stamp = str(int(time.time()))
    headers = {webhook.TIMESTAMP_HEADER: stamp,
               webhook.SIGNATURE_HEADER: webhook.sign(b"k", stamp, body)}
    verify = scope["verify"]
    assert verify(b"k", headers, body)
    assert not verify(b"other", headers, body)
    assert not verify(b"k", headers, body.replace(b"s1", b"s2"))
    old = str(int(time.time()) - 3600)
    forged = "sha256=" + hmac.new(b"k", old.encode() + b"." + body, hashlib.sha256).hexdigest()
    assert not verify(b"k", {webhook.TIMESTAMP_HEADER: old,
                             webhook.SIGNATURE_HEADER: forged}, body)  # replayed late
