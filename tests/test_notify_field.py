"""A seed's ``notify`` webhook URL (task/seed_task.py): checked where a seed enters, a seed
line or ``POST /dispatch``, refused with the field named; stored with the seed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.observability.notify import NotifyConfig
from meteorseed_scrapy.seeding.records import seed_to_dict
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.task.seed_task import NOTIFY_URL_MAX, SeedTask, check_notify_url
from meteorseed_scrapy.task.validation import TaskError
from tests.api_helpers import ApiServer, Client, url_list

NASTY = [
    ("file:///etc/passwd", "must be an http(s) URL"),
    ("gopher://127.0.0.1:6379/_FLUSHALL", "must be an http(s) URL"),
    ("javascript:alert(1)", "must be an http(s) URL"),
    ("http://user:pass@hooks.example/x", "user name or password"),
    ("https://token@hooks.example/x", "user name or password"),
    ("http://hooks.example/" + "a" * 10_000, "more than the limit"),
    ("http://hooks.example/x\nX-Injected: 1", "control character"),
    ("http://hooks.example/x\r\n", "control character"),
    ("http://hooks.example/ x", "control character"),
    ("http://hooks.example:99999/", "not a valid URL"),
    ("http://[::1/", "not a valid URL"),
    ("http:///path-only", "not a valid URL"),
    ("//hooks.example/x", "must be an http(s) URL"),
    ("", "must be a non-empty string"),
    (["http://hooks.example/"], "must be an http(s) URL or null"),
    (42, "must be an http(s) URL or null"),
]


def line(notify: Any) -> str:
    return json.dumps({"seed_id": "s1", "site_id": "news", "task_type": "url_list",
                       "payload": {"urls": ["https://news.example/a"]}, "notify": notify})


@pytest.mark.parametrize(("value", "problem"), NASTY)
def test_a_nasty_notify_value_is_refused_naming_the_field(value: Any, problem: str) -> None:
    with pytest.raises(TaskError) as info:
        check_notify_url(value)
    assert info.value.field == "notify" and problem in info.value.problem
    with pytest.raises(SeedLineError, match=r"^line 7: notify: "):
        parse_seed_line(line(value), 7)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=60),
    st.builds(lambda scheme, rest: f"{scheme}://{rest}",
              st.sampled_from(["http", "https", "HTTP", "ftp", "file"]),
              st.text(max_size=60))))
def test_any_notify_value_is_a_clean_web_url_or_refused_naming_the_field(value: str) -> None:
    try:
        check_notify_url(value)
    except TaskError as exc:
        assert exc.field == "notify"
        return
    parts = urlsplit(value)
    assert parts.scheme.lower() in ("http", "https") and parts.hostname
    assert parts.username is None and parts.password is None
    assert len(value) <= NOTIFY_URL_MAX and not any(c.isspace() or ord(c) < 32 for c in value)


def test_the_notify_url_travels_with_the_seeds_definition() -> None:
    seed = parse_seed_line(line("https://hooks.example/done?key=1"), 1)
    assert seed.notify == "https://hooks.example/done?key=1"
    assert SeedTask.from_dict(seed_to_dict(seed)) == seed  # what the registry stores
    assert "notify" not in seed_to_dict(parse_seed_line(line(None), 1))


@pytest.fixture
def client(api_server: ApiServer) -> Iterator[Client]:
    with api_server(notify=NotifyConfig(secret="")) as running:
        yield Client(running.url)


@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(value=st.sampled_from([v for v, _p in NASTY]) | st.text(max_size=40))
def test_dispatch_refuses_a_bad_notify_naming_the_field(client: Client, value: Any) -> None:
    try:
        check_notify_url(value)
        return  # (an acceptable one: not this test's subject)
    except TaskError:
        pass
    status, _, body = client.call("POST", "/dispatch", [
        url_list("good", ["https://news.example/a"]),
        url_list("bad", ["https://news.example/b"], notify=value)])
    assert status == 202, body
    assert [e["field"] for e in body["errors"]] == ["seeds[1].notify"]


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/",
                                 "http://127.0.0.1:6379/", "http://[::1]/", "http://10.1.2.3/"])
def test_dispatch_refuses_a_literal_private_webhook_unless_allowed(
        api_server: ApiServer, url: str) -> None:
    for allowed in (False, True):
        with api_server(notify=NotifyConfig(secret="", private_addresses=allowed)) as running:
            status, _, body = Client(running.url).call("POST", "/dispatch", url_list(
                f"s-{allowed}", ["https://news.example/a"], notify=url))
        if allowed:
            assert status == 202 and body["accepted"] == 1, body
        else:
            assert status == 422, body
            [error] = body["errors"]
            assert error["field"] == "notify"
            assert "METEORSEED_NOTIFY_PRIVATE_ADDRESSES" in error["problem"]
