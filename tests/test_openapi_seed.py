"""The seed schema of ``POST /dispatch`` in OpenAPI is generated from SeedTask: the validator
and the schema accept the same fields (``lane`` was accepted but missing, with
additionalProperties false), and every seed the validator takes, the schema takes too."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meteorseed_scrapy.api.dispatch import validate_seed
from meteorseed_scrapy.api.openapi import build_spec, seed_schema
from meteorseed_scrapy.api.problems import InvalidInput
from meteorseed_scrapy.task.lanes import LANES
from meteorseed_scrapy.task.seed_task import TASK_TYPES, SeedTask
from meteorseed_scrapy.task.validation import TaskError

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = seed_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
FIELDS = {f.name for f in dataclasses.fields(SeedTask)}
GOOD = {"seed_id": "s1", "site_id": "news", "task_type": "url_list",
        "payload": {"urls": ["https://news.example/1"]}}


def accepted(seed: Any) -> bool:
    try:
        validate_seed(seed, "")
    except InvalidInput:
        return False
    return True


def test_the_schema_has_exactly_the_seed_fields() -> None:
    assert set(SCHEMA["properties"]) == FIELDS and "lane" in FIELDS
    assert SCHEMA["additionalProperties"] is False
    assert set(SCHEMA["properties"]["task_type"]["enum"]) == TASK_TYPES
    assert SCHEMA["properties"]["lane"]["enum"] == list(LANES)
    for name in FIELDS:  # required: exactly what from_dict refuses to go without
        missing = {k: v for k, v in GOOD.items() if k != name}
        if name in SCHEMA["required"]:
            with pytest.raises(TaskError, match=f"^{name}: is missing"):
                SeedTask.from_dict(missing)
        else:
            SeedTask.from_dict(missing)


def test_the_dispatch_body_uses_it() -> None:
    body = build_spec()["paths"]["/dispatch"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]
    assert body["oneOf"][0] == SCHEMA and body["oneOf"][1]["items"] == SCHEMA


@pytest.mark.parametrize("extra", [
    {"lane": "scheduled"}, {"lane": "realtime"}, {"priority": -3}, {"callback": "parse_item"},
    {"meta": {"category": "x"}}, {"parse_rule": "r"}, {"schedule": None},
    {"schedule": {"every": "6h"}}, {"callback": None},
])
def test_every_field_the_validator_accepts_the_schema_accepts(extra: dict[str, Any]) -> None:
    seed = {**GOOD, **extra}
    assert accepted(seed) and VALIDATOR.is_valid(seed)


@pytest.mark.parametrize("extra", [
    {"lanes": "scheduled"}, {"lane": "fast"}, {"task_type": "ftp"}, {"priority": True},
    {"seed_id": ""}, {"site_id": "a b"}, {"payload": []}, {"meta": []}, {"callback": 3},
])
def test_both_refuse(extra: dict[str, Any]) -> None:
    seed = {**GOOD, **extra}
    assert not accepted(seed) and not VALIDATOR.is_valid(seed)


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=6),
                   st.sampled_from(["scheduled", "retry", "parse", "parse_item", "url_list",
                                    "sitemap", "s 1", "_x"]),
                   st.just({}), st.just({"every": "1h"}), st.just([]))


@given(st.dictionaries(st.sampled_from([*sorted(FIELDS - {"payload"}), "extra"]), VALUES,
                       max_size=4))
def test_what_dispatch_accepts_the_schema_accepts(changes: dict[str, Any]) -> None:
    seed = {**GOOD, **changes}
    if accepted(seed):
        assert VALIDATOR.is_valid(seed), seed
