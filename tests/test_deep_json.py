"""JSON nested deep, at every boundary where text from outside is decoded: refused the same way
on every Python, naming the field.

``json.loads`` gives up (RecursionError) at about 1,000 levels before Python 3.13 and at about
10,000 from 3.13 on, so each boundary is tried with values that parse on 3.13 only (2,000 and
8,000 levels) and with one that parses nowhere (100,000, or as deep as the boundary's size cap
lets): an object whose field holds the deep value, and a deep value alone. The outcome and the
message must not depend on the Python.
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.api.problems import InvalidInput, json_body
from meteorseed_scrapy.migrate.convert import Origin, start_url_to_task
from meteorseed_scrapy.migrate.unpickle import RejectedPayload, loads_request
from meteorseed_scrapy.observability.notify import delivery_id, payload
from meteorseed_scrapy.politeness import control as site_control
from meteorseed_scrapy.queue.consume import seed_control
from meteorseed_scrapy.queue.consume.deadletters import DeadLetter
from meteorseed_scrapy.queue.fleet.delayed import site_of
from meteorseed_scrapy.queue.fleet.events import Event
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.records import record_from_hash
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.sites.rulefile import parse_text
from meteorseed_scrapy.store.export_cursor import decode_cursor
from meteorseed_scrapy.store.page_cache import CorruptPage, decode
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.json_depth import check_depth, deep_text_path, loads_bounded
from meteorseed_scrapy.task.validation import TaskError
from tests.api_helpers import ApiServer, Client

#: Parses on 3.13, not before; then parses nowhere (200 KB: under every cap but the cursor's).
DEPTHS = [2_000, 8_000, 100_000]
TOO_DEEP = "nests deeper than 64 levels"
#: The 64 levels below a field that holds an array of arrays: where the first too deep one is.
BELOW = "[0]" * 63
TASK = {"task_id": "t1", "seed_id": "s1", "site_id": "news", "url": "https://example.com/a"}


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def holding(field: str, depth: int, **fields: Any) -> str:
    """A JSON object of ``fields`` and, last, ``field`` holding arrays ``depth`` deep."""
    return json.dumps(fields)[:-1] + (", " if fields else "") + f'"{field}": {deep(depth)}}}'


# -- the shared check ------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [65, 900, *DEPTHS])
def test_the_same_path_is_named_whether_json_parses_it_or_not(depth: int) -> None:
    for text, path in ((holding("a", depth, x=1), "body.a" + BELOW),
                       (deep(depth), "body[0]" + BELOW),
                       (holding("a", depth, x=1)[:-depth - 1], "body.a" + BELOW)):  # cut off
        with pytest.raises(TaskError) as info:
            loads_bounded("body", text)
        assert (info.value.field, info.value.problem) == (path, TOO_DEEP)


def test_64_levels_are_accepted_and_a_broken_shallow_text_is_a_plain_value_error() -> None:
    assert loads_bounded("body", holding("a", 63)) == {"a": json.loads(deep(63))}
    assert loads_bounded("body", deep(64)) == json.loads(deep(64))
    with pytest.raises(json.JSONDecodeError):
        loads_bounded("body", '{"a": [1,')
    for depth in DEPTHS:  # broken before the deep part: every Python's json stops there
        with pytest.raises(json.JSONDecodeError, match="Expecting value: line 1 column 7"):
            loads_bounded("body", '{"a": tru, "b": ' + deep(depth) + "}")


spine = st.lists(st.tuples(st.booleans(), st.text(max_size=4), st.integers(0, 2),
                           st.integers(0, 2)), min_size=60, max_size=70)


@given(spine, st.booleans())
def test_the_scan_of_the_text_and_the_walk_of_the_value_agree(
        steps: list[tuple[bool, str, int, int]], cut: bool) -> None:
    """A value whose deepest branch goes through objects and arrays, with siblings before and
    after: the text scan (json gave up) names what the walk of the value (json parsed) names."""
    value: Any = "leaf"
    for is_object, key, before, after in reversed(steps):
        if is_object:
            value = {**{f"b{j}": [j] for j in range(before)}, "k" + key: value,
                     **{f"a{j}": {"x": j} for j in range(after)}}
        else:
            value = [*([j] for j in range(before)), value, *({"x": j} for j in range(after))]
    text = json.dumps(value)
    try:
        check_depth("v", value)
        walked = None
    except TaskError as exc:
        walked = exc.field
    assert (walked is None) == (deepest(value) < 64)
    scanned = deep_text_path("v", text[:len(text) // 2] if cut else text)
    if not cut or scanned is not None:  # (a cut text may end before the deep part)
        assert scanned == walked


def deepest(value: Any, depth: int = 0) -> int:
    """The depth of the deepest array or object in ``value`` (itself: 0), -1 for none."""
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, list):
        return -1
    return max([depth, *(deepest(sub, depth + 1) for sub in value)])


# -- stream messages -------------------------------------------------------------------------

@pytest.mark.parametrize("depth", DEPTHS)
def test_a_stream_message_too_deep_is_refused_the_same_on_every_python(depth: int) -> None:
    deep_meta = json.dumps(TASK)[:-1] + f', "meta": {{"a": {deep(depth)}}}}}'
    for text, reason in ((deep_meta, "meta.a" + BELOW + ": " + TOO_DEEP),
                         (deep_meta[:-depth], "meta.a" + BELOW + ": " + TOO_DEEP),
                         (deep(depth), "task: must be a JSON object")):
        with pytest.raises(TaskError) as info:
            ExecTask.from_message({"v": "1", "t": text})
        assert str(info.value) == reason


@pytest.mark.parametrize("depth", [100, 900, *DEPTHS])
def test_a_deep_message_lacking_a_field_names_the_nesting_on_every_python(depth: int) -> None:
    """Whether json.loads parses it (3.13: 8,000 levels; before: under 1,000) or not, the
    nesting is what is named, not the missing url."""
    text = holding("meta", depth, **{k: v for k, v in TASK.items() if k != "url"})
    with pytest.raises(TaskError) as info:
        ExecTask.from_message({"v": "1", "t": text})
    assert str(info.value) == "meta[0]" + BELOW + ": " + TOO_DEEP


# -- API bodies ------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", DEPTHS)
def test_an_api_body_too_deep_is_invalid_input_naming_the_field(depth: int) -> None:
    for text, field in ((holding("seeds", depth), "body.seeds" + BELOW),
                        (deep(depth), "body[0]" + BELOW)):
        with pytest.raises(InvalidInput) as info:
            json_body(text.encode())
        assert [e.to_json() for e in info.value.errors] == [
            {"field": field, "problem": TOO_DEEP}]


def test_the_api_answers_422_naming_the_field(api_server: ApiServer) -> None:
    with api_server(token=None) as server:
        client = Client(server.url, None)
        for depth in DEPTHS:
            status, _, body = client.call("POST", "/dispatch",
                                          raw=holding("seeds", depth).encode())
            assert status == 422, body
            assert body["errors"] == [{"field": "body.seeds" + BELOW, "problem": TOO_DEEP}]


# -- seed lines ------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", DEPTHS)
def test_a_seed_line_too_deep_is_refused_naming_the_field(depth: int) -> None:
    seed = {"seed_id": "s1", "site_id": "news", "task_type": "url_list",
            "payload": {"urls": ["https://a.example/"]}}
    for line, field in ((holding("meta", depth, **seed), "meta" + BELOW),
                        (deep(depth), "[0]" + BELOW)):
        with pytest.raises(SeedLineError) as info:
            parse_seed_line(line, 7)
        assert str(info.value) == f"line 7: {field}: {TOO_DEEP}"


# -- rule files ------------------------------------------------------------------------------

@pytest.mark.parametrize("depth", DEPTHS)
def test_a_json_rule_file_too_deep_is_a_rule_error_naming_the_field(depth: int) -> None:
    for text, path in ((holding("fields", depth, site_id="news", version=1),
                        "fields" + BELOW), (deep(depth), "[0]" + BELOW)):
        with pytest.raises(RuleError) as info:
            parse_text(text, ".json", "news.json")
        assert (info.value.path, info.value.problem) == (path, TOO_DEEP)


def test_a_yaml_rule_file_too_deep_is_a_rule_error_naming_the_field() -> None:
    with pytest.raises(RuleError) as info:
        parse_text("site_id: news\nfields: " + deep(100) + "\n", ".yaml", "news.yaml")
    assert (info.value.path, info.value.problem) == ("fields" + BELOW, TOO_DEEP)


# -- responses read by a site's rules --------------------------------------------------------

def json_site() -> Any:
    from scrapy import Request
    from scrapy.http import TextResponse

    from meteorseed_scrapy.sites.loader import SiteRegistry
    from meteorseed_scrapy.sites.rulefile import FileResult
    from meteorseed_scrapy.sites.spider import RuleSpider

    rules = {"site_id": "api", "version": 1, "format": "json", "start": "detail",
             "fields": {"title": {"path": "title"}}}
    site = parse_text(json.dumps(rules), ".json", "api.json")
    registry = SiteRegistry(None)
    registry.apply([FileResult("api.json", (0, 0), config=site)])
    spider = RuleSpider(registry=registry, reload_interval=0)

    def parse(body: str) -> list[Any]:
        url = "http://127.0.0.1/item"
        response = TextResponse(url, body=body.encode(), encoding="utf-8",
                                request=Request(url, meta={"site_id": "api"}))
        return list(spider.parse_detail(response))
    return parse


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_response_too_deep_fails_the_callback_naming_the_field(depth: int) -> None:
    parse = json_site()
    assert [i.fields["title"] for i in parse(holding("junk", 511, title="t"))] == ["t"]
    for body, field in ((holding("junk", depth, title="t"), "response.junk" + "[0]" * 511),
                        (deep(depth), "response" + "[0]" * 512)):
        field = field[:200] + "…" + field[-99:]  # (the middle of a long path left out)
        with pytest.raises(TaskError) as info:
            parse(body)
        assert (info.value.field, info.value.problem) == (field, "nests deeper than 512 levels")


# -- Redis values another process wrote ------------------------------------------------------

@pytest.mark.parametrize("depth", DEPTHS)
def test_pushed_rule_records_too_deep_are_reported_not_raised(
        sync_redis: redis.Redis, namespace: str, depth: int) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.sites, "news", holding("text", depth, source="news.json"))
    rules = RemoteRules(sync_redis, keys)
    assert rules.entries()["news"]["error"] == (
        f"not JSON: record.text{BELOW}: {TOO_DEEP}")
    [result] = rules.changes({})
    assert result.error is not None and f"record.text{BELOW}: {TOO_DEEP}" in str(result.error)


@pytest.mark.parametrize("depth", DEPTHS)
def test_controls_and_delayed_members_too_deep_read_as_damaged(
        sync_redis: redis.Redis, namespace: str, depth: int) -> None:
    keys = KeyLayout(namespace)
    record = holding("reason", depth, by="x")
    sync_redis.hset(keys.seed_controls, "s1", record)
    sync_redis.hset(keys.held, "news", record)
    assert seed_control.control_of(sync_redis, keys, "s1")["damaged"] == record[:200]
    assert seed_control.controls(sync_redis, keys)["s1"]["damaged"] == record[:200]
    assert site_control.controls(sync_redis, keys)["news"]["held"] == {"damaged": record[:200]}
    task = holding("meta", depth, **TASK)
    assert site_of(task) is None and site_of("news|" + task) is None
    assert seed_control._seed_of(task) is None


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_dead_letter_too_deep_is_listed_as_not_a_valid_task(depth: int) -> None:
    letter = DeadLetter.decode("1-0", {"t": holding("meta", depth, **TASK), "reason": "r"})
    assert letter.task is None and letter.site_id == "news"  # (listed under its site)
    assert letter.error == f"not a valid task (meta{BELOW}[0]: {TOO_DEEP})"  # 64 below meta
    alone = DeadLetter.decode("1-1", {"t": deep(depth)})
    assert alone.error == "not a valid task (task: must be a JSON object)"


@pytest.mark.parametrize("depth", DEPTHS)
def test_an_event_field_too_deep_reads_as_absent(depth: int) -> None:
    event = Event("1-0", "finished", {"seed": "s1", "counters": holding("done", depth)})
    assert event.json_field("counters") is None
    assert json.loads(payload(event, "ns"))["counters"] == {}


def test_a_bad_event_field_is_reported_once_however_often_it_is_read(
        caplog: pytest.LogCaptureFixture) -> None:
    event = Event("1-0", "finished", {"seed": "s1", "counters": "{not json"})
    with caplog.at_level(logging.WARNING, logger="meteorseed_scrapy.queue.fleet.events"):
        payload(event, "ns")
        delivery_id(event, "ns")
        assert event.json_field("counters") is None
    assert [r.getMessage()[:38] for r in caplog.records] == [
        "Event 1-0: field counters read as abse"]
    assert event == Event("1-0", "finished", {"seed": "s1", "counters": "{not json"})


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_seed_record_too_deep_is_unreadable(depth: int) -> None:
    definition = holding("meta", depth, seed_id="s1", site_id="news", task_type="url_list",
                         payload={"urls": ["https://a.example/"]})
    assert record_from_hash("s1", {"def": definition}, None, 0) is None


def test_an_export_cursor_too_deep_is_not_a_cursor() -> None:
    # 1,500 levels: as deep as the cursor's 4,096 characters allow (refused by length beyond)
    for text in (deep(1500), holding("a", 1499)):
        cursor = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
        with pytest.raises(ValueError, match=r"^not a cursor printed by meteorseed export$"):
            decode_cursor(cursor, "sqlite")


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_cached_page_envelope_too_deep_is_corrupt(depth: int) -> None:
    with pytest.raises(CorruptPage) as info:
        decode(zlib.compress(holding("headers", depth, v=1).encode() + b"\nbody"))
    assert str(info.value) == f"envelope: headers{BELOW}: {TOO_DEEP}"


# -- scrapy-redis queue migration ------------------------------------------------------------

@pytest.mark.parametrize("depth", DEPTHS)
def test_a_migrated_entry_too_deep_is_rejected_alone(depth: int) -> None:
    request = holding("meta", depth, url="https://example.com/")
    with pytest.raises(RejectedPayload, match=r"^entry is nested deeper than 50 levels$"):
        loads_request(request.encode())
    with pytest.raises(RejectedPayload, match=r"^entry is nested deeper than 50 levels$"):
        start_url_to_task(request, Origin("spider", "start_urls"))
