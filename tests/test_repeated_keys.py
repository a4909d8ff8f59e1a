"""A key twice in one JSON object (or YAML mapping), at every boundary where text from outside is
decoded: refused, naming the key's path, where ``json.loads`` and PyYAML keep the last value and
drop the first without a word. A site's response is the exception: it is read as a browser
reads it, the last value kept.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.api.problems import InvalidInput, json_body
from meteorseed_scrapy.migrate.convert import Origin, start_url_to_task
from meteorseed_scrapy.migrate.unpickle import RejectedPayload, loads_request
from meteorseed_scrapy.queue.consume.deadletters import DeadLetter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.remote import RemoteRules
from meteorseed_scrapy.sites.rulefile import parse_text
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.task.json_depth import REPEATED, loads_bounded, repeated_key_path
from meteorseed_scrapy.task.validation import TaskError
from tests.api_helpers import ApiServer, Client
from tests.test_deep_json import BELOW, TOO_DEEP, deep, json_site

TASK = '{"task_id":"t1","seed_id":"s1","site_id":"news","url":"https://example.com/a"'
SEED = ('{"seed_id":"s1","site_id":"news","task_type":"url_list",'
        '"payload":{"urls":["https://a.example/1"]%s}}')
RULES = '{"site_id":"news","version":1,"start":"detail","fields":{"t":"h1::text"%s}%s}'


# -- the parser ------------------------------------------------------------------------------

NAMED = [
    ('{"a":1,"a":2}', "body.a"),
    ('{"a":1,"a":1}', "body.a"),  # (the same value twice is a repeat too)
    ('{"a":{"b":[1,{"c":1,"d":2,"c":3}]}}', "body.a.b[1].c"),
    ('[{"x":1},{"x":1,"x":2}]', "body[1].x"),
    ('{"k":1,"\\u006b":2}', "body.k"),  # an escape spells the same key
    ('{"":1,"":2}', "body."),
    ('{"a":{"x":1},"b":{"x":1},"a":3}', "body.a"),  # (keys repeat across objects freely)
    ('{"a":{"b":1,"b":2},"c":1,"c":2}', "body.a.b"),  # the first in document order
]


@pytest.mark.parametrize(("text", "path"), NAMED, ids=[p for _, p in NAMED])
def test_a_key_twice_in_one_object_is_refused_naming_its_path(text: str, path: str) -> None:
    with pytest.raises(TaskError) as info:
        loads_bounded("body", text)
    assert (info.value.field, info.value.problem) == (path, REPEATED)
    with pytest.raises(TaskError):  # bytes as text
        loads_bounded("body", text.encode())


def test_nesting_is_named_before_a_repeat_and_a_repeat_before_what_breaks_after_it() -> None:
    # nesting first, wherever the repeat is (json.loads gives up at a depth that depends on
    # the Python; the repeat must not be named on one and the nesting on another)
    for text in ('{"a":1,"a":2,"z":' + deep(2000) + "}", '{"z":' + deep(2000) + ',"a":1,"a":2}'):
        with pytest.raises(TaskError) as info:
            loads_bounded("body", text)
        assert (info.value.field, info.value.problem) == ("body.z" + BELOW, TOO_DEEP)
    # (an object is judged once it closes: a repeat in one that breaks off is broken JSON)
    with pytest.raises(TaskError) as info:
        loads_bounded("body", '{"x":{"a":1,"a":2},"b":')
    assert info.value.field == "body.x.a"
    for broken in ('{"a":1,"a":2,"b":', '{"b":,"x":{"a":1,"a":2}}'):
        with pytest.raises(json.JSONDecodeError):
            loads_bounded("body", broken)


def test_a_response_keeps_the_last_value_as_json_loads_and_a_browser_do() -> None:
    assert loads_bounded("response", '{"a":1,"a":2}', unique=False) == {"a": 2}
    parse = json_site()
    assert [i.fields["title"] for i in parse('{"title":"old","title":"new"}')] == ["new"]


keys = st.text(max_size=3)
scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=5)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(keys, inner, max_size=3), max_leaves=12)


def _objects(value: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every object in ``value`` with its path, in document order."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(value, dict):
        found.append((path, value))
        for key, sub in value.items():
            found += _objects(sub, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            found += _objects(sub, f"{path}[{index}]")
    return found


def _dumps(value: Any, repeat_in: int | None, counter: list[int]) -> str:
    """``value`` as JSON; the ``repeat_in``-th object (document order) written with its first
    key twice (the first time with another value)."""
    if isinstance(value, list):
        return "[" + ",".join(_dumps(v, repeat_in, counter) for v in value) + "]"
    if not isinstance(value, dict):
        return json.dumps(value)
    index = counter[0]
    counter[0] += 1
    pairs = [json.dumps(k) + ":" + _dumps(v, repeat_in, counter) for k, v in value.items()]
    if index == repeat_in:
        pairs.insert(0, json.dumps(next(iter(value))) + ':"first"')
    return "{" + ",".join(pairs) + "}"


@given(values, st.data())
def test_any_document_parses_as_json_loads_until_a_key_comes_twice(value: Any,
                                                                  data: st.DataObject) -> None:
    text = json.dumps(value)
    assert loads_bounded("v", text) == json.loads(text)
    objects = _objects(value, "v")
    holders = [index for index, (_, obj) in enumerate(objects) if obj]
    if not holders:
        return
    ordinal = data.draw(st.sampled_from(holders))
    path, obj = objects[ordinal]
    repeated = _dumps(value, ordinal, [0])
    with pytest.raises(TaskError) as info:
        loads_bounded("v", repeated)
    assert (info.value.field, info.value.problem) == (f"{path}.{next(iter(obj))}", REPEATED)
    assert repeated_key_path("v", repeated) == info.value.field
    assert json.loads(repeated) == value  # what json.loads keeps: the last value


# -- the boundaries --------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "field"), [
    (TASK + ',"url":"https://evil.example/"}', "url"),
    (TASK + ',"meta":{"k":1,"k":2}}', "meta.k"),
    (TASK + ',"headers":{"Cookie":["a"],"Cookie":["b"]}}', "headers.Cookie"),
])
def test_a_stream_message_with_a_key_twice_is_refused_naming_it(body: str, field: str) -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.from_message({"v": "1", "t": body})
    assert (info.value.field, info.value.problem) == (field, REPEATED)
    letter = DeadLetter.decode("1-0", {"t": body, "reason": "r"})
    assert letter.task is None and letter.site_id == "news"  # (listed under its site)
    assert letter.error == f"not a valid task ({field}: {REPEATED})"


def test_a_stream_message_that_is_no_object_is_named_so_whatever_it_repeats() -> None:
    with pytest.raises(TaskError, match=r"^task: must be a JSON object$"):
        ExecTask.from_message({"v": "1", "t": '[{"a":1,"a":2}]'})


def test_a_seed_line_with_a_key_twice_is_refused_naming_it() -> None:
    assert parse_seed_line(SEED % "", 3).payload == {"urls": ["https://a.example/1"]}
    for line, field in ((SEED % ',"urls":["https://b.example/"]', "payload.urls"),
                        ((SEED % "")[:-1] + ',"site_id":"other"}', "site_id")):
        with pytest.raises(SeedLineError) as info:
            parse_seed_line(line, 3)
        assert str(info.value) == f"line 3: {field}: {REPEATED}"


def test_an_api_body_with_a_key_twice_is_a_422_naming_it(api_server: ApiServer) -> None:
    body = ('{"seeds":[{"seed_id":"s1","site_id":"news","task_type":"url_list",'
            '"payload":{"urls":["https://a.example/"]},"priority":1,"priority":9}]}')
    with pytest.raises(InvalidInput) as info:
        json_body(body.encode())
    assert [e.to_json() for e in info.value.errors] == [
        {"field": "body.seeds[0].priority", "problem": REPEATED}]
    with api_server(token=None) as server:
        status, _, reply = Client(server.url, None).call("POST", "/dispatch", raw=body.encode())
    assert status == 422, reply
    assert reply["errors"] == [{"field": "body.seeds[0].priority", "problem": REPEATED}]


def test_a_json_rule_file_with_a_key_twice_is_a_rule_error_naming_it() -> None:
    for text, path in ((RULES % ("", ',"fields":{"u":"h2::text"}'), "fields"),
                       (RULES % (',"t":"h2::text"', ""), "fields.t")):
        with pytest.raises(RuleError) as info:
            parse_text(text, ".json", "news.json")
        assert (info.value.path, info.value.problem) == (path, REPEATED)
    assert parse_text(RULES % ("", ""), ".json", "news.json").site_id == "news"


YAML = "site_id: news\nversion: 1\nstart: detail\nfields:\n  t: 'h1::text'\n"


@pytest.mark.parametrize(("extra", "path", "where"), [
    ("site_id: other\n", "site_id", "lines 1 and 6"),
    ("  t: 'h2::text'\n", "fields.t", "lines 5 and 6"),
    ("limits: {rate: 1, rate: 2}\n", "limits.rate", "line 6, columns 10 and 19"),
    ("limits: {yes: 1, true: 2}\n", "limits.true", "line 6, columns 10 and 18"),  # both True
    ("x: [{a: 1, a: 2}]\n", "x[0].a", "line 6, columns 6 and 12"),
    ("x: &x {a: 1, a: 2}\ny: *x\n", "x.a", "line 6, columns 8 and 14"),  # first place met
])
def test_a_yaml_rule_file_with_a_key_twice_is_a_rule_error_naming_it_and_its_lines(
        extra: str, path: str, where: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_text(YAML + extra, ".yaml", "news.yaml")
    assert (info.value.path, info.value.problem) == (
        path, f"appears more than once in its mapping ({where})")


def test_a_yaml_merge_may_still_be_overridden() -> None:
    config = parse_text(YAML + "limits:\n  <<: {rate: 1, burst: 2}\n  rate: 3\n", ".yaml",
                        "news.yaml")
    assert (config.limits.rate, config.limits.burst) == (3, 2)
    # (and distinct keys that look alike are distinct: 1 and "1")
    with pytest.raises(RuleError, match="unknown key"):
        parse_text(YAML + "limits: {1: 1, '1': 2}\n", ".yaml", "news.yaml")


def test_pushed_rule_records_with_a_key_twice_are_reported_not_raised(
        sync_redis: redis.Redis, namespace: str) -> None:
    keys = KeyLayout(namespace)
    sync_redis.hset(keys.sites, "news", '{"text":"a","source":"news.json","text":"b"}')
    rules = RemoteRules(sync_redis, keys)
    assert rules.entries()["news"]["error"] == f"not JSON: record.text: {REPEATED}"
    [result] = rules.changes({})
    assert result.error is not None and f"record.text: {REPEATED}" in str(result.error)


def test_a_migrated_entry_with_a_key_twice_is_rejected_alone_naming_it() -> None:
    request = '{"url":"https://example.com/","meta":{"depth":1,"depth":2}}'
    with pytest.raises(RejectedPayload, match=rf"^entry: meta.depth: {REPEATED}$"):
        loads_request(request.encode())
    with pytest.raises(RejectedPayload, match=rf"^entry: meta.depth: {REPEATED}$"):
        start_url_to_task(request, Origin("spider", "start_urls"))
