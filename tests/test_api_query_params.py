"""A query parameter its operation does not take is refused (422, ``query.<name>``), on every
operation the OpenAPI description lists: ignored, a misspelt filter answers for everything."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from urllib.parse import quote, urlencode

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.api.auth import is_public
from meteorseed_scrapy.api.openapi import build_spec
from meteorseed_scrapy.api.query_params import unknown_query
from meteorseed_scrapy.testing.redis_server import RedisServer
from tests.api_helpers import Client, server_factory

OPERATIONS = sorted((method.upper(), path) for path, ops in build_spec()["paths"].items()
                    for method in ops if not is_public(path))


@pytest.fixture(scope="module")
def client(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Client]:
    """One server for the module's calls (a refused query reaches no handler, no Redis)."""
    namespace = f"q{uuid.uuid4().hex[:12]}"
    with server_factory(request)(redis_url=redis_server.url, namespace=namespace) as running:
        yield Client(running.url)


@pytest.mark.parametrize(("method", "template"), OPERATIONS)
def test_every_operation_refuses_a_query_parameter_it_does_not_take(
        client: Client, method: str, template: str) -> None:
    path = re.sub(r"\{\w+\}", "x", template)
    status, headers, body = client.call(method, f"{path}?sitee_id=news&sitee_id=web",
                                        {} if method == "POST" else None)
    assert status == 422, body
    assert headers["Content-Type"].startswith("application/problem+json")
    [error] = body["errors"]  # (named once, however often it is given)
    assert error["field"] == "query.sitee_id"
    assert error["problem"].startswith(f"is not a parameter of {method} {template} (expected ")


def test_a_misspelt_filter_is_named_with_the_ones_there_are(client: Client) -> None:
    status, _, body = client.call("GET", "/dead-letters?site=news&limit=5&lmit=6")
    assert status == 422
    assert body["errors"] == [
        {"field": "query.site",
         "problem": "is not a parameter of GET /dead-letters (expected limit, site_id)"},
        {"field": "query.lmit",
         "problem": "is not a parameter of GET /dead-letters (expected limit, site_id)"}]
    status, _, body = client.call("GET", "/dead-letters?site_id=news&limit=5")
    assert status == 200, body


def test_the_public_pages_take_a_links_parameters(client: Client) -> None:
    for path in ("/console/?utm_source=mail", "/openapi.json?v=2", "/?from=docs"):
        status, _, _ = client.call("GET", path, token=None)
        assert status == 200, path


def test_the_token_is_asked_before_the_query_is_judged(client: Client) -> None:
    status, _, _ = client.call("GET", "/seeds?sitee_id=news", token=None)
    assert status == 401


@settings(max_examples=60, deadline=None)
@given(name=st.text(min_size=0, max_size=30).filter(
    lambda n: n not in ("site_id", "offset", "limit")))
def test_any_other_name_is_refused_by_that_name(client: Client, name: str) -> None:
    """Empty, control characters, a near miss, an encoded ``&`` or ``=``: the name the
    server decoded is the one named."""
    status, _, body = client.call("GET", f"/seeds?{urlencode({name: '1'}, quote_via=quote)}")
    assert status == 422, body
    assert body["errors"] == [e.to_json() for e in unknown_query("GET", "/seeds", [name])]
    assert [e["field"] for e in body["errors"]] == [f"query.{name}"[:200]]


def test_unknown_query_lists_nothing_for_a_path_the_api_does_not_describe() -> None:
    assert unknown_query("GET", "/no-such-path", ["x"]) == []
    assert unknown_query("HEAD", "/seeds", ["limit"]) == []  # (HEAD is GET's)
    assert [e.field for e in unknown_query("HEAD", "/seeds", ["x"])] == ["query.x"]
