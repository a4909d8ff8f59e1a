"""Completion webhooks: a ``finished`` event becomes one signed POST, at least once, never to a
private address unless allowed (observability/notify.py, observability/webhook.py).

A real Redis and a receiver on loopback (allowed through the setting, except where the refusal
is what is tested); the ``finished`` events are XADDed here in the format the counters write.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

from meteorseed_scrapy.observability import webhook
from meteorseed_scrapy.observability.notify import GROUP, Deliverer, NotifyConfig, delivery_id
from meteorseed_scrapy.politeness.policy import Backoff
from meteorseed_scrapy.queue.fleet.events import CrawlEvent, Event, append
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.testing.polling import wait_for, wait_until
from tests.api_helpers import ApiServer, Client, url_list
from tests.e2e_helpers import running, terminate

SECRET = "webhook-secret"
BIN = Path(sys.executable).parent
COUNTERS = {"enqueued": 3, "done": 2, "dead": 1, "items": 7}


class Receiver:
    """A webhook receiver on loopback answering from a script: a status, ``(status,
    headers)``, or ``"hang"`` (no answer until :meth:`close`); 200 once the script runs out."""

    def __init__(self, script: list[Any] | None = None, port: int = 0) -> None:
        self.script = list(script or [])
        self.calls: list[tuple[dict[str, str], bytes, Any]] = []
        self.release = threading.Event()
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    action = outer.script.pop(0) if outer.script else 200
                    outer.calls.append((dict(self.headers), body, action))
                if action == "hang":
                    outer.release.wait(60)
                    return
                status, headers = action if isinstance(action, tuple) else (action, {})
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook?x=1"

    def ok_calls(self) -> list[tuple[dict[str, str], bytes, Any]]:
        return [c for c in self.calls if c[2] == 200 or (isinstance(c[2], tuple)
                                                         and c[2][0] == 200)]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


def config(**changes: Any) -> NotifyConfig:
    values: dict[str, Any] = dict(secret=SECRET, private_addresses=True, attempts=5,
                                  backoff=Backoff(0.01, 0.05), timeout=5.0, concurrency=4,
                                  claim_idle=30.0)
    return NotifyConfig(**{**values, **changes})


def finished(sync_redis: redis.Redis, namespace: str, seed: str) -> str:
    return append(sync_redis, KeyLayout(namespace).events, CrawlEvent.FINISHED, seed=seed,
                  counters=COUNTERS)


def events_of(sync_redis: redis.Redis, namespace: str, name: str) -> list[dict[str, str]]:
    return [f for _i, f in sync_redis.xrange(KeyLayout(namespace).events)
            if f["event"] == name]


def pending(sync_redis: redis.Redis, namespace: str) -> int:
    return int(sync_redis.xpending(KeyLayout(namespace).events, GROUP)["pending"])


Body = Callable[[Deliverer], Awaitable[None]]


def with_deliverer(redis_url: str, namespace: str, urls: dict[str, str], body: Body,
                   **changes: Any) -> None:
    """Run a deliverer (seed -> URL from ``urls``) while ``body`` runs, then cancel it."""
    async def lookup(seed: str) -> str | None:
        return urls.get(seed)

    consumer = changes.pop("consumer", "d1")

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        deliverer = Deliverer(client, KeyLayout(namespace), config(**changes), lookup,
                              consumer=consumer, read_block_ms=100)
        task = asyncio.ensure_future(deliverer.run())
        try:
            await body(deliverer)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()

    asyncio.run(main())


def test_a_finished_seed_is_posted_once_signed(redis_url: str, namespace: str,
                                               sync_redis: redis.Redis,
                                               receiver: Receiver) -> None:
    entry = finished(sync_redis, namespace, "s1")
    append(sync_redis, KeyLayout(namespace).events, CrawlEvent.STARTED, seed="s2")
    finished(sync_redis, namespace, "no-webhook")

    async def body(_d: Deliverer) -> None:
        await wait_until(lambda: events_of(sync_redis, namespace, "notify delivered"), 30)
        await wait_until(lambda: pending(sync_redis, namespace) == 0, 30)

    with_deliverer(redis_url, namespace, {"s1": receiver.url, "s2": receiver.url}, body)
    [(headers, raw, _status)] = receiver.calls  # the started event and the seed without one
    assert json.loads(raw) == {"event": "finished", "seed_id": "s1", "counters": COUNTERS,
                               "finished_at": pytest.approx(time.time(), abs=60),
                               "namespace": namespace}
    stamp = headers[webhook.TIMESTAMP_HEADER]
    assert headers[webhook.SIGNATURE_HEADER] == webhook.sign(SECRET.encode(), stamp, raw)
    assert webhook.verify(SECRET.encode(), stamp, raw, headers[webhook.SIGNATURE_HEADER])
    assert not webhook.verify(b"other", stamp, raw, headers[webhook.SIGNATURE_HEADER])
    assert not webhook.verify(SECRET.encode(), stamp, raw + b" ",
                              headers[webhook.SIGNATURE_HEADER])
    assert not webhook.verify(SECRET.encode(), str(int(stamp) - 3600), raw,
                              headers[webhook.SIGNATURE_HEADER])  # a replay, later
    assert headers[webhook.DELIVERY_HEADER] == entry
    [done] = events_of(sync_redis, namespace, "notify delivered")
    assert (done["seed"], done["status"], done["attempts"]) == ("s1", "200", "1")


def test_5xx_then_2xx_is_delivered_with_exactly_one_success(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    receiver = Receiver([500, (503, {"Retry-After": "0"}), 200])
    try:
        finished(sync_redis, namespace, "s1")

        async def body(_d: Deliverer) -> None:
            await wait_until(lambda: events_of(sync_redis, namespace, "notify delivered"), 30)
            await wait_until(lambda: pending(sync_redis, namespace) == 0, 30)

        with_deliverer(redis_url, namespace, {"s1": receiver.url}, body)
        assert [c[2] for c in receiver.calls] == [500, (503, {"Retry-After": "0"}), 200]
        assert len({c[0][webhook.DELIVERY_HEADER] for c in receiver.calls}) == 1
        assert events_of(sync_redis, namespace, "notify delivered")[0]["attempts"] == "3"
        assert pending(sync_redis, namespace) == 0
    finally:
        receiver.close()


def test_a_receiver_down_then_up_gets_its_call(redis_url: str, namespace: str,
                                               sync_redis: redis.Redis) -> None:
    import socket

    holder = socket.socket()  # bound, not listening: connections refused meanwhile
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    tries: list[webhook.Attempt] = []
    started: list[Receiver] = []

    async def post(url: str, body: bytes, headers: Any, **kw: Any) -> webhook.Attempt:
        outcome = await webhook.post(url, body, headers, **kw)
        tries.append(outcome)
        if len(tries) == 2:  # down twice: the receiver comes up on the same port
            holder.close()
            started.append(Receiver(port=port))
        return outcome

    finished(sync_redis, namespace, "s1")

    async def body(d: Deliverer) -> None:
        d.post = post
        await wait_until(lambda: events_of(sync_redis, namespace, "notify delivered"), 30)

    try:
        with_deliverer(redis_url, namespace, {"s1": f"http://127.0.0.1:{port}/hook"}, body,
                       attempts=10)
        assert [t.status for t in tries] == [None, None, 200] and tries[0].retry
        assert len(started[0].ok_calls()) == 1
    finally:
        holder.close()
        for r in started:
            r.close()


def test_a_deliverer_stopped_mid_call_leaves_it_to_another(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    receiver = Receiver(["hang"])
    try:
        finished(sync_redis, namespace, "s1")
        urls = {"s1": receiver.url}

        async def first(_d: Deliverer) -> None:  # cancelled once its call is under way
            await wait_until(lambda: receiver.calls, 30)

        with_deliverer(redis_url, namespace, urls, first, consumer="d1")
        assert pending(sync_redis, namespace) == 1  # not acknowledged: not delivered

        async def second(_d: Deliverer) -> None:
            await wait_until(lambda: events_of(sync_redis, namespace, "notify delivered"), 30)
            await wait_until(lambda: pending(sync_redis, namespace) == 0, 30)

        with_deliverer(redis_url, namespace, urls, second, consumer="d2", claim_idle=0.2)
        assert [c[2] for c in receiver.calls] == ["hang", 200]
        assert len(receiver.ok_calls()) == 1
        assert receiver.calls[0][1] == receiver.calls[1][1]  # the same call again
    finally:
        receiver.close()


def test_a_private_address_is_refused_with_the_reason(redis_url: str, namespace: str,
                                                      sync_redis: redis.Redis,
                                                      receiver: Receiver) -> None:
    finished(sync_redis, namespace, "s1")
    finished(sync_redis, namespace, "s2")
    urls = {"s1": receiver.url, "s2": "http://localhost:1/hook"}

    async def body(_d: Deliverer) -> None:
        await wait_until(lambda: len(events_of(sync_redis, namespace, "notify failed")) == 2,
                         30)
        await wait_until(lambda: pending(sync_redis, namespace) == 0, 30)

    with_deliverer(redis_url, namespace, urls, body, private_addresses=False)
    assert receiver.calls == []
    failed = {f["seed"]: f for f in events_of(sync_redis, namespace, "notify failed")}
    assert "127.0.0.1 is a loopback address" in failed["s1"]["reason"]
    assert "localhost (" in failed["s2"]["reason"]  # a name: its address checked
    assert webhook.PRIVATE_SETTING in failed["s1"]["reason"]
    assert failed["s1"]["attempts"] == "1"  # no retry changes that
    assert pending(sync_redis, namespace) == 0


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[::1]:8080/", "http://10.0.0.1/",
    "http://[::ffff:127.0.0.1]/", "http://0.0.0.0/", "http://[fd00:ec2::254]/"])
def test_a_literal_private_address_is_refused_without_a_connection(url: str) -> None:
    outcome = asyncio.run(webhook.post(url, b"{}", {}, timeout=5))
    assert outcome.status is None and not outcome.retry and "refused" in outcome.reason
    assert webhook.literal_refusal(url) is not None
    assert webhook.literal_refusal(url, private_addresses=True) is None


def test_a_redirect_or_a_4xx_is_not_followed_nor_retried(redis_url: str, namespace: str,
                                                        sync_redis: redis.Redis) -> None:
    receiver = Receiver([(302, {"Location": "http://169.254.169.254/"}), 404])
    try:
        finished(sync_redis, namespace, "s1")
        finished(sync_redis, namespace, "s2")

        async def body(_d: Deliverer) -> None:
            await wait_until(lambda: len(events_of(sync_redis, namespace, "notify failed"))
                             == 2, 30)

        with_deliverer(redis_url, namespace, {"s1": receiver.url, "s2": receiver.url}, body,
                       concurrency=1)
        reasons = sorted(f["reason"] for f in events_of(sync_redis, namespace,
                                                        "notify failed"))
        assert reasons[0].startswith("HTTP 302 to 'http://169.254.169.254/': redirects are")
        assert reasons[1].startswith("HTTP 404")
        assert len(receiver.calls) == 2
    finally:
        receiver.close()


def test_attempts_run_out_and_the_failure_is_recorded(redis_url: str, namespace: str,
                                                      sync_redis: redis.Redis) -> None:
    receiver = Receiver([500] * 10)
    try:
        finished(sync_redis, namespace, "s1")

        async def body(_d: Deliverer) -> None:
            await wait_until(lambda: events_of(sync_redis, namespace, "notify failed"), 30)
            await wait_until(lambda: pending(sync_redis, namespace) == 0, 30)

        with_deliverer(redis_url, namespace, {"s1": receiver.url}, body, attempts=3)
        [failed] = events_of(sync_redis, namespace, "notify failed")
        assert (failed["attempts"], failed["reason"]) == ("3", "HTTP 500: ok")
        assert len(receiver.calls) == 3 and pending(sync_redis, namespace) == 0
    finally:
        receiver.close()


def test_serve_delivers_the_webhook_of_a_dispatched_seed(api_server: ApiServer, namespace: str,
                                                         sync_redis: redis.Redis,
                                                         receiver: Receiver) -> None:
    with api_server(notify=config()) as server:
        status, _, body = Client(server.url).call("POST", "/dispatch", url_list(
            "s1", ["https://news.example/a"], notify=receiver.url))
        assert status == 202, body
        _, _, shown = Client(server.url).call("GET", "/seeds/s1")
        assert shown["seed"]["notify"] == receiver.url  # stored with the seed
        finished(sync_redis, namespace, "s1")
        wait_for(lambda: receiver.calls, 30)
    [(headers, raw, _)] = receiver.calls
    assert json.loads(raw)["seed_id"] == "s1"
    assert webhook.verify(SECRET.encode(), headers[webhook.TIMESTAMP_HEADER], raw,
                          headers[webhook.SIGNATURE_HEADER])


def test_the_notify_command_delivers_until_sigterm(redis_url: str, namespace: str,
                                                   sync_redis: redis.Redis,
                                                   receiver: Receiver) -> None:
    async def register() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)
        try:
            await SeedRegistry(client, KeyLayout(namespace)).put(SeedTask.from_dict(url_list(
                "s1", ["https://news.example/a"], notify=receiver.url)))
        finally:
            await client.aclose()

    asyncio.run(register())
    env = {k: v for k, v in os.environ.items() if not k.startswith("METEORSEED_")}
    cmd = [str(BIN / "meteorseed"), "notify", "--redis-url", redis_url, "--namespace",
           namespace]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2 and "METEORSEED_NOTIFY_SECRET is not set" in refused.stderr
    env.update(METEORSEED_NOTIFY_SECRET=SECRET, METEORSEED_NOTIFY_PRIVATE_ADDRESSES="true")
    with running(cmd, env=env) as proc:
        finished(sync_redis, namespace, "s1")
        wait_for(lambda: receiver.calls, 60)
        err = terminate(proc)
    assert proc.returncode == 0, err
    [(headers, raw, _)] = receiver.calls
    assert webhook.verify(SECRET.encode(), headers[webhook.TIMESTAMP_HEADER], raw,
                          headers[webhook.SIGNATURE_HEADER])


def test_one_run_announced_twice_keeps_one_delivery_id() -> None:
    def event(entry: str, seed: str, **counters: Any) -> Event:
        return Event(entry, "finished", {"seed": seed, "at": "1.000",
                                         "counters": json.dumps({"done": 1, **counters})})

    first = delivery_id(event("1-0", "s1", run=2, started_at=10.5), "ns")
    assert first == delivery_id(event("2-0", "s1", run=2, started_at=10.5), "ns")
    assert len({first, delivery_id(event("1-0", "s1", run=3, started_at=99.0), "ns"),
                delivery_id(event("1-0", "s2", run=2, started_at=10.5), "ns"),
                delivery_id(event("1-0", "s1", run=2, started_at=10.5), "other")}) == 4
    assert delivery_id(event("7-0", "s1"), "ns") == "7-0"  # no run: the event's id


def test_a_deliverer_cancelled_at_any_moment_stops(redis_url: str, namespace: str,
                                                   sync_redis: redis.Redis,
                                                   receiver: Receiver) -> None:
    """Cancelled while its Redis commands are in flight (redis-py 8.2 can swallow such a
    cancellation and keep the task running: ``meteorseed serve`` would never stop)."""
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, decode_responses=True)

        async def lookup(seed: str) -> str | None:
            return receiver.url

        try:
            for round_ in range(20):
                finished(sync_redis, namespace, f"s{round_}")
                deliverer = Deliverer(client, KeyLayout(namespace), config(), lookup,
                                      consumer="d1", read_block_ms=100)
                task = asyncio.ensure_future(deliverer.run())
                await wait_until(lambda r=round_: any(
                    f["seed"] == f"s{r}" for f in events_of(sync_redis, namespace,
                                                             "notify delivered")), 30, 0.001)
                task.cancel()  # (its ack, its next read, or its claim under way)
                done, _ = await asyncio.wait([task], timeout=30)
                assert done, f"round {round_}: the cancelled deliverer still runs"
        finally:
            await client.aclose()

    asyncio.run(main())
    assert len(receiver.ok_calls()) >= 20  # (one a round; a round's unacked one comes again)
