"""A JSON record kept in Redis (who held a site or overrode its limits, a seed's last control,
a task's done record) is read by one function, ``replies.record_of``: anything but a JSON object
reads as ``{"damaged": ...}``, and the lists and pages that show records show it so rather than
fail (a record of ``[1]`` or ``null`` used to crash ``seeds list``, ``seeds controls``,
``sites controls`` and ``GET /seeds``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.politeness import control
from meteorseed_scrapy.queue.consume import seed_control
from meteorseed_scrapy.queue.inspect.task_query import parse_query
from meteorseed_scrapy.queue.inspect.task_state import task_state_plan
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.reads import run_sync
from meteorseed_scrapy.queue.plumbing.replies import DAMAGED_SHOWN, record_of
from meteorseed_scrapy.task.exec_task import ExecTask
from tests.cli_helpers import cli

NOT_OBJECTS = ["[1]", "[]", '"x"', "1", "-0.5", "null", "true", "", " ", "{", "not json",
               "{}" + "x", "[" * 100 + "]" * 100, '{"a":' * 100 + "1" + "}" * 100,
               "\ufeff{}", '{"a": NaN', "x" * 5000]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                    st.floats(allow_nan=False, allow_infinity=False))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=10)


def damaged(text: str) -> dict[str, str]:
    return {"damaged": text[:DAMAGED_SHOWN]}


@given(VALUES)
def test_an_object_is_the_record_and_anything_else_is_damaged(value: Any) -> None:
    text = json.dumps(value)
    expected = value if isinstance(value, dict) else damaged(text)
    assert record_of(text) == expected
    assert record_of(text.encode()) == expected  # (a client that does not decode)


@pytest.mark.parametrize("text", NOT_OBJECTS)
def test_the_nasty_ones_by_name(text: str) -> None:
    assert record_of(text) == damaged(text)


def test_bytes_that_are_not_utf8_read_as_damaged_text() -> None:
    assert record_of(b"\xff\xfe{") == {"damaged": "\ufffd\ufffd{"}


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.sampled_from(NOT_OBJECTS), VALUES.map(json.dumps)))
def test_every_reader_of_control_records_reads_them_so(sync_redis: redis.Redis,
                                                       namespace: str, text: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.seed_controls, "s1", text)
    sync_redis.hset(keys.held, "news", text)
    sync_redis.hset(keys.overrides, "news", text)
    expected = record_of(text)
    assert isinstance(expected, dict)
    assert seed_control.control_of(sync_redis, keys, "s1") == {
        **expected, "held": False, "cancelled": False}
    assert seed_control.controls(sync_redis, keys)["s1"] == {
        **expected, "held": False, "cancelled": False}
    assert control.controls(sync_redis, keys) == {"news": {"held": expected,
                                                           "override": expected}}


@pytest.mark.parametrize("text", ["[1]", "null", '"x"', "{"])
def test_the_commands_list_a_damaged_record_and_go_on(redis_url: str, namespace: str,
                                                      sync_redis: redis.Redis,
                                                      text: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.seed_controls, "s1", text)
    sync_redis.hset(keys.held, "news", text)
    code, out, err = cli(redis_url, namespace, "sites", "controls")
    assert code == 0 and "news" in out, err
    code, out, err = cli(redis_url, namespace, "sites", "controls", "--json")
    assert code == 0 and json.loads(out) == {"news": {"held": damaged(text)}}, err
    code, out, err = cli(redis_url, namespace, "seeds", "controls", "--json")
    assert code == 0 and json.loads(out)["s1"]["damaged"] == text, err
    code, out, err = cli(redis_url, namespace, "seeds", "list")
    assert code == 0, err


def test_a_done_record_that_is_not_an_object_is_shown_damaged(
        namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    one = ExecTask.create(seed_id="s", site_id="news", url="https://news.test/a/1")
    sync_redis.set(keys.done(one.task_id), "[1, 2]")
    found = run_sync(sync_redis, task_state_plan(keys, parse_query(one.task_id)))
    assert [p["record"] for p in found.places if p["state"] == "done"] == [damaged("[1, 2]")]
