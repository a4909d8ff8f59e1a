"""The ``meteorseed`` CLI never writes a stored control character raw to the terminal: a URL,
reason, site or consumer name holding ``\\x1b[2J`` (clear screen), OSC title sequences, C1
controls or bidi overrides is shown escaped; ``--json`` stays valid JSON with the exact values."""

from __future__ import annotations

import asyncio
import io
import json
import time

import redis
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.cli import main
from meteorseed_scrapy.cli.common import TerminalStream, printable
from meteorseed_scrapy.queue.keys import GROUP, KeyLayout
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask

CLEAR = "\x1b[2J"
HOSTILE = f"{CLEAR}\x1b]0;pwned\x07\x9b31m\u202eevil\x7f"
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\x7f")


def run(redis_url: str, namespace: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--redis-url", redis_url, "--namespace", namespace],
                stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def assert_clean(*texts: str) -> None:
    for text in texts:
        assert not any(c in text for c in RAW), repr(text)


def test_printable() -> None:
    assert printable("https://a.example/p?q=1") == "https://a.example/p?q=1"
    assert printable(f"x{CLEAR}y") == "x\\x1b[2Jy"
    assert printable("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert printable("a\nb\x1b", newlines=True) == "a\nb\\x1b"
    assert printable("\u202eabc\x9b\ud800") == "\\u202eabc\\x9b\\ud800"
    assert printable("caf\u00e9 \u5bc6") == "caf\u00e9 \u5bc6"  # printable text is kept as is


@given(st.text())
def test_printable_output_is_always_printable(text: str) -> None:
    assert printable(text).isprintable()
    assert all(line.isprintable() for line in printable(text, newlines=True).split("\n"))
    out = io.StringIO()
    print(text, file=TerminalStream.of(out))
    assert all(line.isprintable() for line in out.getvalue().split("\n"))


def test_dead_list_and_show_escape_urls_and_reasons(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    task = ExecTask.create(seed_id="s1", site_id="news", url=f"https://news.test/{HOSTILE}")
    letter = str(sync_redis.xadd(keys.dead, {
        "t": task.to_message()["t"], "reason": f"HTTP 500 {HOSTILE}\nTraceback: {CLEAR}",
        "source_id": "1-1", "consumer": f"w{CLEAR}", "deliveries": "5", "at": "1700000000.5"}))
    broken = str(sync_redis.xadd(keys.dead, {"t": f"not json {HOSTILE}\nforged line",
                                             "reason": "malformed"}))

    code, listed, err = run(redis_url, namespace, "dead", "list")
    assert code == 0 and "\\x1b[2J" in listed
    assert_clean(listed, err)
    code, shown, err = run(redis_url, namespace, "dead", "show", letter)
    assert code == 0
    assert_clean(shown, err)
    assert f"url:         https://news.test/{printable(HOSTILE)}" in shown
    assert "consumer:    w\\x1b[2J" in shown
    assert "\n  Traceback: \\x1b[2J" in shown  # the reason keeps its lines, escaped
    code, shown, _ = run(redis_url, namespace, "dead", "show", broken)
    assert_clean(shown)
    assert "forged line" in shown and "\nforged line" not in shown  # one line, as stored

    # --json: valid JSON holding the exact stored values, no raw control character.
    code, text, _ = run(redis_url, namespace, "dead", "show", letter, "--json")
    assert code == 0
    assert_clean(text)
    data = json.loads(text)
    assert data["url"] == task.url and data["consumer"] == f"w{CLEAR}"


def test_status_and_sites_escape_stored_names(
        sync_redis: redis.Redis, redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
    sync_redis.xreadgroup(GROUP, f"worker{HOSTILE}", {keys.stream: ">"}, count=1)
    sync_redis.hset(keys.sites, f"site{CLEAR}", json.dumps(
        {"version": f"v{HOSTILE}", "source": "/srv/\u202eevil.yaml", "error": "bad\x9bthing"}))

    code, text, err = run(redis_url, namespace, "status")
    assert code == 0
    assert_clean(text, err)
    code, text, err = run(redis_url, namespace, "sites", "list")
    assert code == 0 and "site\\x1b[2J" in text and "\\u202eevil" in text
    assert_clean(text, err)
    code, text, _ = run(redis_url, namespace, "sites", "list", "--json")
    assert_clean(text)
    assert json.loads(text)[f"site{CLEAR}"]["source"] == "/srv/\u202eevil.yaml"


def test_seeder_list_escapes_last_error(redis_url: str, namespace: str) -> None:
    keys = KeyLayout(namespace)

    async def record() -> None:
        client = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            registry = SeedRegistry(client, keys)
            await registry.put(SeedTask(seed_id="s1", site_id="news",
                                        task_type="url_list",
                                        payload={"urls": ["https://news.example/"]},
                                        schedule="every 1h"))
            await registry.record_run("s1", started_at=time.time(), ok=False,
                                      error=f"fetch failed {HOSTILE}\nforged", new_urls=0,
                                      duplicates=0, rejected=0)
        finally:
            await client.aclose()

    asyncio.run(record())
    code, text, err = run(redis_url, namespace, "seeder", "--list")
    assert code == 0, err
    assert_clean(text, err)
    assert "fetch failed \\x1b[2J" in text and "\nforged" not in text


def test_error_lines_are_redacted_and_escaped(namespace: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    url = f"redis://:s3cr%2Ft@127.0.0.1:1/0?client_name={CLEAR}"
    code = main(["status", "--redis-url", url, "--namespace", namespace],
                stdin=io.StringIO(), stdout=out, stderr=err)
    assert code == 2
    assert_clean(err.getvalue())
    assert "s3cr" not in err.getvalue() and "redis://***@127.0.0.1:1/0" in err.getvalue()
