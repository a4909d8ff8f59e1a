"""Seeds name public spider methods only, tasks any method of the spider's class but Python's
and scrapy.Spider's own; seeds cannot set Scrapy's download controls.

Refused everywhere a seed or a task comes in (a seed line, ``POST /dispatch``'s validation, the
seeder's registry, a stream message) with the field named, and again on the worker where a
task becomes a Request (the spider is known there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.api.dispatch import validate_seed
from meteorseed_scrapy.api.problems import InvalidInput
from meteorseed_scrapy.seeding.seed_lines import SeedLineError, parse_seed_line
from meteorseed_scrapy.task.exec_task import MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import (
    RESERVED_META_KEYS,
    SPIDER_OWN_NAMES,
    TaskError,
    check_callback,
)
from meteorseed_scrapy.worker.requests import request_to_task, task_to_request

BIN = Path(sys.executable).parent


class GuardedSpider(scrapy.Spider):
    name = "guarded"
    allowed_domains = ["shop.example"]
    not_a_method = "parse_item"
    handler = staticmethod(lambda response: None)
    Item = scrapy.Item  # a callable class attribute, not a method

    def parse(self, response: Any, **kwargs: Any) -> Any:
        return None

    def parse_item(self, response: Any, **kwargs: Any) -> Any:
        return None

    async def parse_async(self, response: Any) -> Any:
        return None

    def closed(self, reason: str) -> None:  # a spider's own hook, defined here: still no callback
        return None

    def _private(self, response: Any) -> Any:
        return None

    @classmethod
    def make(cls, response: Any) -> Any:
        return None

    @property
    def shown(self) -> Any:
        return print


def seed(**extra: Any) -> dict[str, Any]:
    return {"seed_id": "s", "site_id": "shop", "task_type": "url_list",
            "payload": {"urls": ["https://shop.example/"]}, **extra}


def unchecked_task(**fields: Any) -> ExecTask:
    """A task as a forged stream message would give it, past ExecTask's own checks (the worker
    must not rely on them having run)."""
    task = ExecTask.create(seed_id="s", site_id="shop", url="https://shop.example/a")
    forged = object.__new__(ExecTask)
    forged.__dict__.update({**task.__dict__, **fields})
    return forged


DUNDER_NAMES = ["__init__", "__class__", "__setattr__", "__dict__", "__", "__init_subclass__"]
#: Refused in seeds; in tasks (a spider's own requests: CrawlSpider's _callback) only when not
#: a method of the spider's class or scrapy.Spider's own.
SINGLE_UNDERSCORE = ["_private", "_"]
PRIVATE_NAMES = [*DUNDER_NAMES, *SINGLE_UNDERSCORE, "_parse", "_set_crawler"]
OWN_NAMES = ["start", "start_requests", "close", "closed", "from_crawler", "update_settings",
             "handles_request", "log", "logger", "set_crawler", "crawler", "settings", "name"]


# -- callbacks -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*DUNDER_NAMES, "_parse", "_set_crawler", *OWN_NAMES])
@pytest.mark.parametrize("field", ["callback", "errback"])
def test_private_and_spider_own_names_are_refused_in_tasks(name: str, field: str) -> None:
    with pytest.raises(TaskError) as info:
        ExecTask.create(seed_id="s", site_id="x", url="https://a.example/", **{field: name})
    assert info.value.field == field and repr(name) in info.value.problem


@pytest.mark.parametrize("name", PRIVATE_NAMES + OWN_NAMES)
def test_seed_lines_and_dispatch_refuse_them_naming_the_field(name: str) -> None:
    with pytest.raises(SeedLineError) as line_error:
        parse_seed_line(json.dumps(seed(callback=name)), 3)
    assert line_error.value.reason.startswith("callback: ")
    with pytest.raises(InvalidInput) as api_error:
        validate_seed(seed(callback=name), "seeds[4].")
    [error] = api_error.value.errors
    assert error.field == "seeds[4].callback"


def test_a_forged_message_naming_init_is_refused_when_decoded() -> None:
    raw = json.dumps({"task_id": "t1", "seed_id": "s", "site_id": "shop",
                      "url": "https://shop.example/", "callback": "__init__",
                      "cb_kwargs": {"allowed_domains": ["evil.example"]}})
    with pytest.raises(TaskError) as info:
        ExecTask.from_message({"v": MESSAGE_VERSION, "t": raw})
    assert info.value.field == "callback"


@pytest.mark.parametrize("name", [n for n in PRIVATE_NAMES if n != "_private"] + OWN_NAMES + [
    "not_a_method", "handler", "Item", "make", "shown", "missing", "mro"])
def test_the_worker_refuses_anything_but_a_method_of_the_spider(name: str) -> None:
    spider = GuardedSpider()
    with pytest.raises(TaskError) as info:
        task_to_request(unchecked_task(callback=name), spider)
    assert info.value.field == "callback"
    with pytest.raises(TaskError) as info:
        task_to_request(unchecked_task(errback=name), spider)
    assert info.value.field == "errback"


def test_init_with_cb_kwargs_no_longer_rewrites_the_spider() -> None:
    spider = GuardedSpider()
    task = unchecked_task(callback="__init__", cb_kwargs={"allowed_domains": ["evil.example"]})
    with pytest.raises(TaskError, match="callback"):
        task_to_request(task, spider)
    assert spider.allowed_domains == ["shop.example"]


def test_public_methods_still_work_both_ways() -> None:
    spider = GuardedSpider()
    for name in ("parse", "parse_item", "parse_async"):
        request = task_to_request(unchecked_task(callback=name, errback="parse_item"), spider)
        assert request.callback == getattr(spider, name)
        child = request_to_task(scrapy.Request("https://shop.example/b", callback=request.callback),
                                spider, None)
        assert child.callback == name


def test_a_private_method_of_the_spider_travels_by_name() -> None:
    spider = GuardedSpider()
    child = request_to_task(scrapy.Request("https://shop.example/b", callback=spider._private,
                                           errback=spider._private), spider, None)
    assert (child.callback, child.errback) == ("_private", "_private")
    again = task_to_request(ExecTask.from_message(child.to_message()), spider)
    assert again.callback == spider._private and again.errback == spider._private


def test_a_spider_yielding_a_foreign_callback_gets_a_clear_error() -> None:
    spider = GuardedSpider()
    with pytest.raises(TaskError) as info:
        request_to_task(scrapy.Request("https://shop.example/b",
                                       callback=GuardedSpider()._private), spider, None)
    assert info.value.field == "callback"


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=30),
    st.from_regex(r"\A_{1,3}[A-Za-z0-9_]{0,20}\Z"),
    st.sampled_from(sorted(SPIDER_OWN_NAMES | set(dir(GuardedSpider)))),
))
def test_any_name_is_either_a_method_of_the_spider_or_refused_naming_the_field(name: str
                                                                              ) -> None:
    spider = GuardedSpider()
    try:
        request = task_to_request(unchecked_task(callback=name), spider)
    except TaskError as exc:
        assert exc.field == "callback"
        return
    assert name in {"parse", "parse_item", "parse_async", "_private"}
    assert request.callback == getattr(spider, name)
    # what the worker accepted, every other entry point of tasks accepts too
    check_callback(name, private=True)


# -- meta --------------------------------------------------------------------------------------

RESERVED = [
    *sorted(RESERVED_META_KEYS), "_auth_proxy", "_scheme_proxy", "_anything", "meteorseed_task",
    "meteorseed_site", "meteorseed_proxy", "meteorseed_lease", "playwright_page_methods",
    "playwright_context"]


@pytest.mark.parametrize("key", RESERVED)
def test_reserved_meta_keys_are_refused_naming_the_key(key: str) -> None:
    with pytest.raises(TaskError) as info:
        SeedTask.from_dict(seed(meta={"page": 1, key: "x"}))
    assert info.value.field == f"meta.{key}"
    assert "reserved" in info.value.problem
    with pytest.raises(SeedLineError) as line_error:
        parse_seed_line(json.dumps(seed(meta={key: True})), 1)
    assert line_error.value.reason.startswith(f"meta.{key}: reserved")
    with pytest.raises(InvalidInput) as api_error:
        validate_seed(seed(meta={key: 1}), "")
    assert [e.field for e in api_error.value.errors] == [f"meta.{key}"]


def test_the_documented_example() -> None:
    with pytest.raises(TaskError) as info:
        SeedTask.from_dict(seed(meta={"proxy": "http://attacker.example:8080"}))
    assert str(info.value).startswith("meta.proxy: reserved Scrapy key")


@pytest.mark.parametrize("key", ["page", "site_id", "parse_rule", "recrawl_after", "rule",
                                 "referrer_policy", "autothrottle_dont_adjust_delay", "Proxy",
                                 "proxy_pool_hint", "x_proxy"])
def test_ordinary_meta_keys_pass(key: str) -> None:
    value: Any = 60 if key == "recrawl_after" else "v"
    task = SeedTask.from_dict(seed(meta={key: value})).exec_task("https://shop.example/")
    assert task.meta[key] == value


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(
    st.one_of(st.text(max_size=12), st.sampled_from(RESERVED)),
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)), max_size=6))
def test_a_seed_meta_is_accepted_exactly_when_it_sets_no_reserved_key(meta: dict[str, Any]
                                                                        ) -> None:
    reserved = [k for k in meta if k in RESERVED_META_KEYS
                or k.startswith(("_", "meteorseed_", "playwright_")) or k == "playwright"]
    try:
        SeedTask.from_dict(seed(meta=meta))
    except TaskError as exc:
        assert reserved and exc.field == f"meta.{reserved[0]}"
        return
    assert not reserved


def test_spider_requests_keep_their_own_meta() -> None:
    """The check is for seeds (outside input); a spider's own requests are its code."""
    spider = GuardedSpider()
    child = request_to_task(scrapy.Request("https://shop.example/b", meta={
        "dont_redirect": True, "handle_httpstatus_list": [404]}), spider, None)
    assert child.meta["dont_redirect"] is True


# -- a real seed-expand process ----------------------------------------------------------------

def test_seed_expand_reports_each_refused_line_by_number(tmp_path: Path, redis_url: str,
                                                        namespace: str) -> None:
    lines = [seed(seed_id="a", callback="__init__",
                  meta={}, payload={"urls": ["https://shop.example/1"]}),
             seed(seed_id="b", meta={"proxy": "http://attacker.example:1"}),
             seed(seed_id="c", callback="parse_item")]
    proc = subprocess.run(
        [str(BIN / "scrapy"), "seed-expand", "-", "-s", f"METEORSEED_REDIS_URL={redis_url}",
         "-s", f"METEORSEED_NAMESPACE={namespace}"], cwd=tmp_path, text=True,
        input="".join(json.dumps(line) + "\n" for line in lines), capture_output=True,
        timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "line 1: callback: must name a public spider method" in proc.stderr
    assert "line 2: meta.proxy: reserved Scrapy key" in proc.stderr
    assert proc.stdout.strip().endswith("read 3 lines, enqueued 1, duplicates 0, rejected 2")
