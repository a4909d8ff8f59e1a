"""Namespaces never overlap (issue 22.2): a namespace may not contain ':' (refused naming
METEORSEED_NAMESPACE), and the namespace-wide operations (reset, status, the API's scans) touch
only the namespace's own keys, never those of a namespace nested in it by an older version
(``prod:eu:…`` under ``prod``). Real Redis for the scans."""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.queue.keys import KEY_KINDS, KeyLayout, ShardKeys, check_namespace, own_key
from meteorseed_scrapy.queue.scan import scan_namespace
from meteorseed_scrapy.task.exec_task import ExecTask
from meteorseed_scrapy.validators import ConfigError
from tests.cli_helpers import cli
from tests.e2e_helpers import add_tasks


@pytest.mark.parametrize("bad", ["prod:eu", ":prod", "prod:", "a:b:c", "scrapy:requests"])
def test_a_namespace_with_a_colon_is_refused_naming_the_setting(bad: str) -> None:
    with pytest.raises(ConfigError, match="METEORSEED_NAMESPACE") as caught:
        KeyLayout(bad)
    assert "may not contain ':'" in str(caught.value)


@settings(max_examples=300)
@given(st.text(st.one_of(st.sampled_from(":{} \n-_"), st.characters()), max_size=30))
def test_any_text_is_a_namespace_exactly_when_it_cannot_nest_or_break_a_key(text: str) -> None:
    valid = bool(text) and not any(c in text for c in " {}\n:")
    try:
        assert check_namespace(text) == text
    except ConfigError as exc:
        assert not valid and "METEORSEED_NAMESPACE" in str(exc)
    else:
        assert valid


def _sample_args(fn: Any) -> list[Any] | None:
    args: list[Any] = []
    for param in inspect.signature(fn).parameters.values():
        if param.default is not inspect.Parameter.empty:
            continue
        args.append({"lane": "scheduled", "band": "normal", "priority": 0}.get(param.name, "x1"))
    return args


def _keys_of(obj: Any) -> list[str]:
    found: list[str] = []
    for name in dir(obj):
        if name.startswith("_") or name in ("namespace", "group", "pattern", "prefix",
                                            "from_settings", "for_config"):
            continue
        try:
            value = getattr(obj, name)
        except ValueError:  # (a sharded layout's single-shard key: see its shards)
            continue
        if callable(value):
            try:
                value = value(*(_sample_args(value) or []))
            except (TypeError, ValueError, KeyError, AttributeError):  # (not a key maker)
                continue
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found += [v for v in value if isinstance(v, str)]
            found += [k for v in value if isinstance(v, ShardKeys) for k in _keys_of(v)]
        elif isinstance(value, dict):
            found += [k for k in value if isinstance(k, str)]
        elif isinstance(value, ShardKeys):
            found += _keys_of(value)
    return [key for key in found if key.startswith("prod:")]


@pytest.mark.parametrize("layout", [KeyLayout("prod"), KeyLayout("prod", 4),
                                    KeyLayout("prod", 1, cluster=True)],
                         ids=["one Redis", "4 shards", "cluster"])
def test_every_key_the_layout_makes_is_of_a_known_kind(layout: KeyLayout) -> None:
    keys = _keys_of(layout)
    assert len(keys) > 20
    strays = sorted({key for key in keys if not own_key("prod", key)})
    assert strays == [], f"add their kind to KEY_KINDS: {strays}"


def test_a_nested_namespace_s_keys_are_not_the_namespace_s_own() -> None:
    assert not own_key("prod", "prod:eu:tasks")
    assert not own_key("prod", "production:tasks")
    assert own_key("prod", "prod:tasks") and own_key("prod", "prod:{news}:bucket")
    assert "eu" not in KEY_KINDS


def _legacy_nested(client: redis.Redis, nested: str, n: int) -> None:
    """Keys a worker of an older version wrote for namespace ``nested`` (which had a ':')."""
    stand_in = KeyLayout("zzlegacy")
    tasks = [ExecTask.create(seed_id="s1", site_id="news", url=f"https://news.test/{i}")
             for i in range(n)]
    url = client.connection_pool.connection_kwargs
    add_tasks(f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}", "zzlegacy", tasks)
    client.set(stand_in.done("t1"), "1")
    for key in list(client.scan_iter("zzlegacy:*")):
        client.rename(key, nested + key[len("zzlegacy"):])


def test_reset_deletes_its_own_keys_and_shows_and_keeps_a_nested_namespace_s(
    sync_redis: redis.Redis, redis_url: str, namespace: str
) -> None:
    keys = KeyLayout(namespace)
    add_tasks(redis_url, namespace, [
        ExecTask.create(seed_id="s1", site_id="news", url=f"https://news.test/p{i}")
        for i in range(3)])
    sync_redis.set(keys.done("x"), "1")
    own_before = sorted(scan_namespace(sync_redis, keys))
    nested = f"{namespace}:eu"
    _legacy_nested(sync_redis, nested, 3)
    nested_before = sorted(sync_redis.scan_iter(f"{nested}:*"))
    assert len(own_before) >= 3 and len(nested_before) >= 3

    code, out, err = cli(redis_url, namespace, "reset", "--yes", "--json")
    assert code == 0, err
    assert json.loads(out) == {"namespace": namespace, "deleted": len(own_before),
                               "kept": {nested: len(nested_before)}}
    assert f"other namespaces are kept: {nested!r} ({len(nested_before)} keys)" in err
    assert list(scan_namespace(sync_redis, keys)) == []
    assert sorted(sync_redis.scan_iter(f"{nested}:*")) == nested_before

    code, out, _ = cli(redis_url, namespace, "reset", "--yes")
    assert code == 0 and f"deleted 0 keys of namespace {namespace!r}; kept those of" in out


def test_status_of_a_namespace_does_not_count_a_nested_one_s_dedup_roots(
    sync_redis: redis.Redis, redis_url: str, namespace: str
) -> None:
    sync_redis.sadd(f"{namespace}:seen:{{news}}", "a")
    sync_redis.sadd(f"{namespace}:eu:seen:{{other}}", "a")
    keys = KeyLayout(namespace)
    found = sorted(scan_namespace(sync_redis, keys))
    assert found == [f"{namespace}:seen:{{news}}"]


def test_every_command_refuses_a_namespace_with_a_colon(redis_url: str) -> None:
    for argv in (["status"], ["reset", "--yes"]):
        code, out, err = cli(redis_url, "prod:eu", *argv)
        assert code == 2 and out == ""
        assert "METEORSEED_NAMESPACE" in err and "may not contain ':'" in err
