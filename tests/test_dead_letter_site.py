"""The site of a dead letter whose message is no valid task, read from the message's top level
however deep it nests (operators list dead letters per site): never a nested object's
``site_id``, never a value that is no site id, null when two differ or none is there. The
letter holds the task JSON itself, or (a malformed message) the message's fields as a JSON
object whose ``t`` is the task JSON. Hypothesis over built messages and over any JSON, named
nasty cases, and a too-deep message dead-lettered by a consumer against a real Redis."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from meteorseed_scrapy.queue.consume import deadletters
from meteorseed_scrapy.queue.consume.consumer import StreamConsumer
from meteorseed_scrapy.queue.consume.deadletters import DeadLetter
from meteorseed_scrapy.queue.consume.delivery import Delivery
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.task.json_depth import top_level_strings
from meteorseed_scrapy.task.validation import check_id

VALID = ["news", "x", "site-9.example", "ünï", "a" * 200]
INVALID = ["", "a b", "tab\there", "a" * 201, "\ud800", "line\nbreak"]
#: Values of a "site_id" that are no string.
OTHER_VALUES = ["5", "null", "true", '["news"]', '{"site_id": "news"}', "[" * 100 + "]" * 100]
#: Ways of writing the key "site_id".
SITE_KEYS = ['"site_id"', '"site\\u005fid"', '"\\u0073ite_id"']
#: Nested values holding a "site_id" of their own; "{}" and "[]" are where the nesting goes.
NESTS = ['{"site_id": "evil", "a": {}}', '[{"site_id": "evil"}, []]', '{"a": [], "site_id": 5}']
#: Shallow values, some with what looks like a "site_id" member inside a string.
FILLERS = ['"\\"site_id\\": \\"evil\\""', '", \\"site_id\\": \\"evil\\", "', "1.5e3", "null",
           '{"site_id": "evil"}', '[{"site_id": "evil"}]', '"{\\"site_id\\":\\"evil\\"}"',
           '"\\\\"', "[]", "{}"]


def nesting(nest: str, depth: int) -> str:
    """``nest`` inside itself ``depth`` times (where its "{}" or "[]" is), ending with 1."""
    hole = "{}" if "{}" in nest else "[]"
    head, _, tail = nest.partition(hole)
    inner = hole[0] + '"a": 1' + hole[1] if hole == "{}" else "[1]"
    return head * depth + inner + tail * depth


def valid(site: str | None) -> bool:
    try:
        check_id("site_id", site).encode("utf-8")
    except ValueError:
        return False
    return True


@dataclass
class Built:
    """A message's task JSON as built, with where each top-level "site_id" ends."""

    text: str = ""
    # (end of its key, end of its value, its value when a string)
    sites: list[tuple[int, int, str | None]] = field(default_factory=list)

    def add(self, key: str, value: str, site: str | None = None, is_site: bool = False) -> None:
        self.text += ("{" if not self.text else ", ") + key + ": "
        key_end = len(self.text) - 2
        self.text += value
        if is_site:
            self.sites.append((key_end, len(self.text), site))

    def expected(self, cut: int) -> str | None:
        """The site read from the first ``cut`` characters: the one all its top-level site_id
        members (whole, or broken off) agree on, when valid."""
        seen = {site if value_end <= cut else None
                for key_end, value_end, site in self.sites if key_end <= cut}
        one = seen.pop() if len(seen) == 1 else None
        return one if valid(one) else None


member = st.one_of(
    st.tuples(st.just("site"), st.sampled_from(SITE_KEYS), st.just("news")),  # (agreeing)
    st.tuples(st.just("site"), st.sampled_from(SITE_KEYS),
              st.sampled_from(VALID) | st.sampled_from(INVALID)),
    st.tuples(st.just("other site"), st.sampled_from(SITE_KEYS), st.sampled_from(OTHER_VALUES)),
    st.tuples(st.just("nest"), st.sampled_from(NESTS), st.integers(1, 3_000)),
    st.tuples(st.just("filler"), st.sampled_from(["task_id", "meta", "a", "t", ""]),
              st.sampled_from(FILLERS)),
)


@st.composite
def messages(draw: st.DrawFn) -> tuple[Built, int]:
    """A task JSON nesting too deep somewhere (so never a valid task), and a cut of it. Its
    task_id comes first: a letter's payload without one is a malformed message's fields."""
    members = draw(st.lists(member, max_size=6))
    sites = [m for m in members if m[0] == "site"]
    if sites and draw(st.booleans()):  # the same site again, elsewhere
        members.insert(draw(st.integers(0, len(members))), draw(st.sampled_from(sites)))
    deep_at = draw(st.integers(0, len(members)))
    members.insert(deep_at, ("nest", draw(st.sampled_from(NESTS)), draw(st.integers(65, 20_000))))
    ascii_only = draw(st.booleans())
    built = Built()
    built.add('"task_id"', '"t1"')
    for kind, first, second in members:
        if kind == "site":
            built.add(first, json.dumps(second, ensure_ascii=ascii_only), second, True)
        elif kind == "other site":
            built.add(first, str(second), None, True)
        elif kind == "nest":
            built.add('"meta"', nesting(str(first), int(second)))
        else:
            built.add(json.dumps(first), str(second))
    built.text += "}"
    cut = draw(st.one_of(st.just(len(built.text)), st.integers(0, len(built.text))))
    return built, cut


def site_of_letter(text: str) -> str | None:
    letter = DeadLetter.decode("1-0", {"t": text, "reason": "r"})
    assert letter.task is None
    return letter.site_id


def site_of_message(text: str) -> str | None:
    """The site of the dead letter of a message ``{v: 1, t: text}``, as a worker writes it."""
    delivery = Delivery.decode("ns:tasks", "1-0", [("v", "1"), ("t", text)], 1)
    assert delivery.task is None
    return site_of_letter(delivery.dead_payload)


@settings(max_examples=300, deadline=None)
@given(messages())
def test_a_dead_letter_s_site_is_its_message_s_top_level_one(message: tuple[Built, int]) -> None:
    built, cut = message
    text = built.text[:cut]
    expected = built.expected(cut)
    assert site_of_letter(text) == expected
    assert site_of_message(text) == expected


# -- any JSON: the scan reads what json reads ------------------------------------------------

keys = st.sampled_from(["site_id", "t", "a", "", "é\"\\"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(max_size=6), st.sampled_from(VALID))
# (an object as its members, a key maybe repeated: json keeps every one for the hook below)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3).map(tuple)
                      | st.lists(st.tuples(keys, inner), max_size=4), max_leaves=15)
spaces = st.sampled_from(["", " ", "\n\t ", "\r\n"])


def render(value: object, space: str) -> str:
    if isinstance(value, tuple):
        return "[" + f",{space}".join(render(v, space) for v in value) + space + "]"
    if isinstance(value, list):
        return "{" + space + f",{space}".join(
            f"{json.dumps(k)}{space}:{space}{render(v, space)}" for k, v in value) + "}"
    return json.dumps(value)


@given(st.lists(st.tuples(keys, values), max_size=5), spaces)
def test_the_scan_reads_the_top_level_members_json_reads(
        members: list[tuple[str, object]], space: str) -> None:
    text = space + render(members, space) + space
    pairs = json.loads(text, object_pairs_hook=lambda p: p)
    expected: dict[str, list[str | None]] = {}
    for key, value in pairs:
        if key in ("site_id", "t"):
            expected.setdefault(key, []).append(value if isinstance(value, str) else None)
    assert top_level_strings(text, ("site_id", "t")) == expected


@given(st.text(alphabet='{}[]:," \\abst_id5', max_size=60))
def test_any_text_gives_a_valid_site_or_none(text: str) -> None:
    site = site_of_letter(text)
    assert site is None or valid(site)


# -- named nasty cases -----------------------------------------------------------------------

HEAD = '{"task_id": "t1", "seed_id": "s1", "url": "https://example.com/a", '
DEEP = "[" * 100_000 + "]" * 100_000
DEEP_OBJECTS = '{"a": ' * 30_000 + "1" + "}" * 30_000

NAMED: list[tuple[str, str, str | None]] = [
    ("site before the deep part", HEAD + f'"site_id": "news", "meta": {{"a": {DEEP}}}}}',
     "news"),
    ("site after the deep part", HEAD + f'"meta": {{"a": {DEEP}}}, "site_id": "news"}}', "news"),
    ("site after deep objects", HEAD + f'"meta": {DEEP_OBJECTS}, "site_id": "news"}}', "news"),
    ("site between two deep parts", HEAD + f'"a": {DEEP}, "site_id": "news", "b": {DEEP}}}',
     "news"),
    ("cut in the deep part", (HEAD + f'"site_id": "news", "meta": {DEEP}}}')[:150_000], "news"),
    ("only nested in the deep part",
     HEAD + '"meta": ' + '{"site_id": "evil", "a": ' * 100 + "1" + "}" * 101, None),
    ("nested before the top-level one",
     HEAD + f'"meta": {{"site_id": "evil", "a": {DEEP}}}, "site_id": "news"}}', "news"),
    ("nested after the top-level one",
     HEAD + f'"site_id": "news", "m": [{{"site_id": "evil"}}, {DEEP}]}}', "news"),
    ("the deep part is the site", HEAD + f'"site_id": {DEEP}}}', None),
    ("an escaped key", HEAD + f'"site\\u005fid": "news", "meta": {DEEP}}}', "news"),
    ("an escaped value", HEAD + f'"site_id": "n\\u0065ws", "meta": {DEEP}}}', "news"),
    ("twice the same", HEAD + f'"site_id": "news", "a": {DEEP}, "site_id": "news"}}', "news"),
    ("twice, differing", HEAD + f'"site_id": "news", "a": {DEEP}, "site_id": "evil"}}', None),
    ("twice, one broken off", HEAD + f'"site_id": "news", "a": {DEEP}, "site_id": "ne', None),
    ("empty", HEAD + f'"site_id": "", "meta": {DEEP}}}', None),
    ("a space", HEAD + f'"site_id": "a b", "meta": {DEEP}}}', None),
    ("too long", HEAD + f'"site_id": "{"x" * 201}", "meta": {DEEP}}}', None),
    ("a lone surrogate", HEAD + f'"site_id": "\\udc80", "meta": {DEEP}}}', None),
    ("a control character", HEAD + f'"site_id": "ne\x01ws", "meta": {DEEP}}}', None),
    ("a number", HEAD + f'"site_id": 5, "meta": {DEEP}}}', None),
    ("in a string", HEAD + f'"x": "\\", \\"site_id\\": \\"evil", "meta": {DEEP}}}', None),
    ("after a stray close", HEAD + f'"a": {DEEP}]], "site_id": "evil"}}', None),
    ("after the object closed", HEAD + f'"a": {DEEP}}}, "site_id": "evil"}}', None),
    ("after a trailing comma", HEAD + f'"a": [{DEEP},], "site_id": "evil"}}', None),
    ("after a key with no value", HEAD + f'"a", "site_id": "evil", "b": {DEEP}}}', None),
    ("a top-level array", f'[{{"site_id": "evil"}}, {DEEP}]', None),
    ("an unterminated string", HEAD + '"site_id": "news", "a": "' + "\\" * 300_001, "news"),
    ("a million openings", HEAD + '"site_id": "news", "a": ' + "[" * 1_000_000, "news"),
]


@pytest.mark.parametrize(("text", "site"), [(t, s) for _, t, s in NAMED],
                         ids=[n for n, _, _ in NAMED])
def test_a_nasty_message_s_dead_letter_shows_its_site_or_none(text: str, site: str | None
                                                                ) -> None:
    assert site_of_letter(text) == site
    assert site_of_message(text) == site


LETTERS: list[tuple[str, str, str | None]] = [
    ("t twice, differing", json.dumps([["v", "1"], ["t", '{"site_id": "news"}'],
                                       ["t", '{"site_id": "evil"}']]), None),
    ("t twice, the same", json.dumps([["v", "1"], ["t", '{"site_id": "news"}'],
                                      ["t", '{"site_id": "news"}']]), "news"),
    ("t not a string", '{"v": "1", "t": {"site_id": "news"}}', None),
    ("task fields as message fields", json.dumps([["site_id", "news"], ["url", "x"]]), "news"),
    ("a shallow task lacking its url", json.dumps([["v", "1"], ["t", json.dumps(
        {"task_id": "t1", "seed_id": "s1", "site_id": "news"})]]), "news"),
    ("a shallow task whose site has a space",
     json.dumps({"task_id": "t1", "seed_id": "s1", "site_id": "a b"}), None),
    ("a shallow task whose site is too long",
     json.dumps({"task_id": "t1", "seed_id": "s1", "site_id": "x" * 201}), None),
]


@pytest.mark.parametrize(("payload", "site"), [(p, s) for _, p, s in LETTERS],
                         ids=[n for n, _, _ in LETTERS])
def test_a_malformed_message_s_letter_shows_its_task_s_site(payload: str, site: str | None
                                                            ) -> None:
    # (pairs as the worker writes them, a name repeated when the message repeats it)
    text = ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in json.loads(payload))
            + "}") if payload.startswith("[") else payload
    assert site_of_letter(text) == site


# -- against a real Redis --------------------------------------------------------------------

def test_a_too_deep_message_dead_lettered_by_a_consumer_lists_under_its_site(
        redis_url: str, namespace: str, sync_redis: redis.Redis) -> None:
    keys = KeyLayout(namespace)
    deep_meta = HEAD + f'"site_id": "news", "meta": {{"a": {DEEP}}}}}'
    nested_only = HEAD + '"meta": {"site_id": "news", "a": ' + DEEP + "}}"

    async def dead_letter_both() -> None:
        client = Redis.from_url(redis_url, decode_responses=True)
        try:
            consumer = StreamConsumer(client, keys, "w1")
            await consumer.ensure_group()
            for text in (deep_meta, nested_only):
                await client.xadd(keys.stream, {"v": "1", "t": text})
            got = await consumer.read(2, 0)
            assert [d.task for d in got] == [None, None]
            for d in got:
                assert await consumer.dead_letter(d, d.error)
        finally:
            await client.aclose()

    asyncio.run(dead_letter_both())
    listed = list(deadletters.iter_dead(sync_redis, keys, site="news"))
    assert len(listed) == 1 and "nests deeper than 64 levels" in listed[0].summary()["reason"]
    assert listed[0].summary()["site_id"] == "news"
    assert [letter.site_id for letter in deadletters.iter_dead(sync_redis, keys)] == ["news",
                                                                                   None]
