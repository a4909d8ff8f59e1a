"""``GET /tasks/{task_id}`` and ``GET /tasks?url=`` of ``meteorseed serve`` against a real Redis:
the same answer as ``meteorseed task``; bad input is a 422 naming the field."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.api.openapi import build_spec
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.api_helpers import ApiServer, Client


@pytest.fixture
def client(api_server: ApiServer) -> Iterator[Client]:
    with api_server() as running:
        yield Client(running.url)


def test_by_id_and_by_url(client: Client, sync_redis: redis.Redis, namespace: str) -> None:
    keys = KeyLayout(namespace)
    one = ExecTask.create(seed_id="s1", site_id="news", url="https://news.test/a?x=1")
    sync_redis.xadd(keys.stream, one.to_message())
    status, _, body = client.call("GET", f"/tasks/{one.task_id}")
    assert status == 200 and body["state"] == "waiting"
    assert body["places"][0]["lane"] == "scheduled" and body["exhaustive"] is True
    url = urllib.parse.quote("https://NEWS.test/a?x=1#frag", safe="")
    status, _, body = client.call("GET", f"/tasks?url={url}&site_id=news")
    assert status == 200 and body["state"] == "waiting"
    assert body["query"]["canonical_url"] == "https://news.test/a?x=1"
    status, _, body = client.call("GET", "/tasks/nope")
    assert status == 200 and body["state"] == "not found"
    assert client.call("GET", f"/tasks/{one.task_id}", token=None)[0] == 401


@pytest.mark.parametrize("path, field", [
    ("/tasks", "query.url"), ("/tasks?url=ftp%3A%2F%2Fx", "query.url"),
    ("/tasks?url=https%3A%2F%2F", "query.url"),
    ("/tasks?url=https%3A%2F%2Fa.test%2F&site_id=a%20b", "query.site_id"),
    ("/tasks/a%20b", "path.task_id"), ("/tasks/" + "x" * 300, "path.task_id"),
    ("/tasks/x?site_id=%0A", "query.site_id"),
])
def test_bad_input_is_422_naming_the_field(client: Client, path: str, field: str) -> None:
    status, _, body = client.call("GET", path)
    assert status == 422, body
    assert [e["field"] for e in body["errors"]] == [field]


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=80))
def test_any_url_parameter_is_an_answer_or_a_422(client: Client, text: str) -> None:
    status, _, body = client.call("GET", "/tasks?url=" + urllib.parse.quote(text, safe=""))
    assert status in (200, 422), body
    if status == 422:
        assert body["errors"][0]["field"] == "query.url"


def test_openapi_describes_the_task_routes() -> None:
    paths = build_spec()["paths"]
    assert "get" in paths["/tasks"] and "get" in paths["/tasks/{task_id}"]
    assert paths["/tasks"]["get"]["parameters"][0]["required"] is True
