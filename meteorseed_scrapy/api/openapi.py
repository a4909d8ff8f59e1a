"""The OpenAPI 3.1 description of every route, served at ``GET /openapi.json``.

Routes are described by hand (the API is small); ``tests/test_api.py`` checks that it is
structurally valid and lists exactly the routes the application has. The seed schema of
``POST /dispatch`` is generated from :class:`~meteorseed_scrapy.task.seed_task.SeedTask`'s
fields and validation constants (:func:`seed_schema`), so it cannot drift from what the
validator accepts; ``tests/test_openapi_seed.py`` keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from meteorseed_scrapy import __version__
from meteorseed_scrapy.api.dispatch import LANE
from meteorseed_scrapy.api.expansion import ExpansionState
from meteorseed_scrapy.politeness.breaker import BreakerState
from meteorseed_scrapy.queue.consume import deadletters
from meteorseed_scrapy.queue.inspect.task_query import ENDS, Place
from meteorseed_scrapy.task.lanes import LANES
from meteorseed_scrapy.task.seed_task import NOTIFY_URL_MAX, TASK_TYPES, SeedTask
from meteorseed_scrapy.task.validation import ID_MAX, SPIDER_MAX

_PROBLEM = {"$ref": "#/components/schemas/Problem"}


def _problems(*codes: int) -> dict[str, Any]:
    reasons = {400: "Bad request", 401: "Missing or invalid bearer token",
               404: "Not found", 409: "Conflict", 413: "Request body too large",
               422: "Invalid input; `errors` names each field path",
               503: "Redis is unavailable (or, for a dispatch, the backlog is full or too "
                    "many background expansions are running: see Retry-After)"}
    return {str(c): {"description": reasons[c],
                     "content": {"application/problem+json": {"schema": _PROBLEM}}}
            for c in codes}


def _ok(description: str, schema: dict[str, Any], code: int = 200) -> dict[str, Any]:
    return {str(code): {"description": description,
                        "content": {"application/json": {"schema": schema}}}}


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


_INT = {"type": "integer"}
_STR = {"type": "string"}
#: A task place's states (queue/inspect/task_query.Place), in their order.
PLACES = [place.value for place in Place]
_NUM = {"type": "number"}
_ANY_OBJ = {"type": "object", "additionalProperties": True}
_NUM_OR_NULL = {"type": ["number", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}
_COUNTS = {"type": "object", "additionalProperties": _INT,
           "description": "count per reason: retry, paused, sick, priority, quota, other, "
                          "unknown (deferred by an older version)"}
_DELAYED = _obj(total=_INT, next_due_at=_NUM_OR_NULL, next_due_in_s=_NUM_OR_NULL,
                scanned=_INT, reasons=_COUNTS,
                sites={"type": "array", "items": _obj(
                    site_id={"type": ["string", "null"]}, count=_INT, reasons=_COUNTS,
                    next_due_at=_NUM_OR_NULL, next_due_in_s=_NUM_OR_NULL)})
_FIELD_ERROR = _obj(field={"type": "string", "examples": ["seeds[2].payload.urls[5]"]},
                    problem=_STR)
_ID = {"type": "string", "minLength": 1, "maxLength": ID_MAX, "pattern": r"^\S+$"}
#: What a field's type alone cannot say: the validator's constants (task/validation.py,
#: task/seed_task.py, task/lanes.py) and what each field means.
_SEED_DETAILS: dict[str, dict[str, Any]] = {
    "seed_id": {**_ID, "description": "unique per seed"},
    "site_id": {**_ID, "description": "picks the site's rules"},
    "task_type": {"enum": sorted(TASK_TYPES)},
    "payload": {"description": "depends on task_type (docs/seeding.md)"},
    "priority": {"description": "Scrapy's convention: higher goes first"},
    "schedule": {"description": "re-run schedule (docs/seeding.md); null: once"},
    "callback": {"description": "a public spider method, not one of scrapy.Spider's own"},
    "meta": {"description": "JSON values; Scrapy's and MeteorSeed's own keys are refused"},
    "lane": {"enum": list(LANES), "default": LANE,
             "description": "stream lane; POST /dispatch defaults to realtime"},
    "spider": {"type": ["string", "null"], "minLength": 1, "maxLength": SPIDER_MAX,
               "pattern": r"^[\w.-]+$",
               "description": "the spider whose workers take its tasks (and their children); "
                              "null: any worker"},
    "notify": {"type": ["string", "null"], "format": "uri", "maxLength": NOTIFY_URL_MAX,
               "description": "completion webhook: one signed POST when the seed has finished "
                              "(docs/webhooks.md); no credentials in the URL"},
}


def _type_schema(hint: Any, name: str) -> dict[str, Any]:
    """JSON Schema of a SeedTask field's annotation; an unknown one fails loudly here."""
    if hint is Any:
        return {}
    if hint is str:
        return {"type": "string"}
    if hint is int:
        return {"type": "integer"}
    if typing.get_origin(hint) is Mapping or hint is dict:
        return {"type": "object", "additionalProperties": True}
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union) and type(None) in args:
        inner = [_type_schema(arg, name) for arg in args if arg is not type(None)]
        if len(inner) == 1 and isinstance(inner[0].get("type"), str):
            return {**inner[0], "type": [inner[0]["type"], "null"]}
    raise TypeError(f"SeedTask.{name}: no JSON Schema for {hint!r}; extend _type_schema")


def seed_schema() -> dict[str, Any]:
    """The JSON Schema of one seed, from :class:`SeedTask`'s fields: required are those
    without a default (the ones ``SeedTask.from_dict`` demands), no other key is accepted."""
    hints = typing.get_type_hints(SeedTask)
    properties: dict[str, Any] = {}
    required = []
    for field in dataclasses.fields(SeedTask):
        properties[field.name] = {**_type_schema(hints[field.name], field.name),
                                  **_SEED_DETAILS.get(field.name, {})}
        if field.default is dataclasses.MISSING and \
                field.default_factory is dataclasses.MISSING:
            required.append(field.name)
    return {"type": "object", "required": required, "properties": properties,
            "additionalProperties": False}


_SEED = seed_schema()
_ID_PARAM = {"name": "seed_id", "in": "path", "required": True, "schema": _STR}
_LETTER_PARAM = {"name": "letter_id", "in": "path", "required": True,
                 "schema": {"type": "string", "pattern": deadletters.LETTER_ID.pattern}}


_TASK_STATE = _obj(
    query=_ANY_OBJ, at=_NUM, last_failure={"type": ["string", "null"]},
    exhaustive={"type": "boolean", "description": "every structure was read in full"},
    state={"enum": list(dict.fromkeys([*PLACES, *ENDS, "deduplicated", "not found"]))},
    places={"type": "array", "items": {**_obj(
        state={"enum": PLACES}, stream=_STR,
        lane=_STR, band=_STR, entry_id=_STR, enqueued_at=_NUM, ahead=_INT,
        consumer={"type": ["string", "null"]}, idle_s=_NUM, deliveries=_INT_OR_NULL,
        why=_STR, due_at=_NUM_OR_NULL, reason=_STR,
        record=_ANY_OBJ, task=_ANY_OBJ), "additionalProperties": True}},
    dedup={"type": "array", "items": _obj(
        site_id=_STR, key=_STR, seen={"type": "boolean"}, window_s=_INT,
        seen_from=_INT_OR_NULL, eligible_at=_INT_OR_NULL)},
    history={"type": "array", "description": "what became of the URL when a task of it last "
             "ended, per site (its task history: docs/tasks.md)", "items": _obj(
                 site_id=_STR, key=_STR, outcome={"enum": list(ENDS)}, at=_NUM, items=_INT,
                 status=_INT_OR_NULL, consumer={"type": ["string", "null"]},
                 reason={"type": ["string", "null"]})},
    searched={"type": "array", "items": _obj(where=_STR, how=_STR, read=_INT,
                                             complete={"type": "boolean"})},
    notes={"type": "array", "items": _STR})


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def _op(summary: str, responses: dict[str, Any], *, public: bool = False,
        **extra: Any) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses, **extra}
    if public:
        op["security"] = []
    return op


def build_spec() -> dict[str, Any]:
    auth = _problems(401, 503)
    return {
        "openapi": "3.1.0",
        "info": {"title": "MeteorSeed dispatch API", "version": __version__,
                 "description": "Dispatch seeds into the realtime lane, follow them, and the "
                                "data of the web console. See docs/api.md."},
        "security": [{"bearer": []}],
        "paths": {
            "/": {"get": _op("Redirect to the web console", {"302": {"description": "to "
                             "/console/"}}, public=True)},
            "/console": {"get": _op("Redirect to the web console", {"302": {
                "description": "to /console/"}}, public=True)},
            "/openapi.json": {"get": _op("This description", _ok("OpenAPI 3.1", _ANY_OBJ),
                                         public=True)},
            "/console/": {"get": _op("The web console (static page; its data needs the token)",
                                     {"200": {"description": "HTML",
                                              "content": {"text/html": {}}}}, public=True)},
            "/console/{name}": {"get": _op(
                "The console's static files", {"200": {"description": "JS/CSS"},
                                               **_problems(404)}, public=True,
                parameters=[{"name": "name", "in": "path", "required": True,
                             "schema": _STR}])},
            "/dispatch": {"post": _op(
                "Register and expand one seed or a list of seeds",
                {**_ok("Accepted (some input may have been rejected: see errors)", _obj(
                    accepted=_INT, rejected_seeds=_INT, enqueued=_INT, duplicates=_INT,
                    rejected_urls=_INT, errors={"type": "array", "items": _FIELD_ERROR},
                    errors_truncated={"type": "boolean"},
                    seeds={"type": "array", "items": _obj(
                        index=_INT, seed_id=_STR,
                        state={"enum": [state.value for state in ExpansionState]},
                        enqueued=_INT, duplicates=_INT, rejected=_INT, href=_STR)}), 202),
                 **_problems(401, 413, 422, 503)},
                requestBody={"required": True, "content": {"application/json": {"schema": {
                    "oneOf": [_SEED, {"type": "array", "items": _SEED, "maxItems": 1000},
                              _obj(seeds={"type": "array", "items": _SEED})]}}}})},
            "/seeds": {"get": _op(
                "Registered seeds with their run state (payloads left out: payload_bytes)",
                {**_ok("A page of seeds", _obj(total=_INT, offset=_INT, limit=_INT,
                                               seeds={"type": "array", "items": _ANY_OBJ})),
                 **_problems(422), **auth},
                parameters=[_query("site_id", _STR, "only this site's seeds"),
                            _query("offset", {"type": "integer", "minimum": 0}, "skip N"),
                            _query("limit", {"type": "integer", "minimum": 1,
                                             "maximum": 200}, "at most N (100)")])},
            "/seeds/{seed_id}": {
                "get": _op("One seed: definition, run state, expansion, and progress (its "
                           "tasks' counters, finished state and time)",
                           {**_ok("The seed", _ANY_OBJ), **_problems(404), **auth},
                           parameters=[_ID_PARAM]),
                "delete": _op("Forget a seed (and stop its expansion)",
                              {**_ok("Deleted", _obj(deleted=_STR,
                                                     expansion_cancelled={"type": "boolean"})),
                               **_problems(404), **auth}, parameters=[_ID_PARAM]),
            },
            "/seeds/{seed_id}/items": {"get": _op(
                "A seed's stored items, in _id order, a page after the cursor `after`",
                {**_ok("A page of items; `next` is the cursor of the next page (null: the "
                       "last)", _obj(seed_id=_STR, limit=_INT, after=_STR, next=_STR,
                                     items={"type": "array", "items": _ANY_OBJ})),
                 **_problems(422, 503), **auth},
                parameters=[_ID_PARAM,
                            _query("after", _STR, "the `next` of the page before"),
                            _query("limit", {"type": "integer", "minimum": 1,
                                             "maximum": 1000}, "at most N (100)")])},
            "/status": {"get": _op(
                "Overview: backlog, pending, delayed, consumers, dead letters, throughput",
                {**_ok("As `meteorseed status --json` (without seen, redis), plus "
                       "throughput rates and seeds",
                       _obj(backlog=_INT, pending=_INT, dead=_INT, seeds=_INT,
                            stream_length=_INT, lag_s=_NUM, delayed=_DELAYED,
                            lanes={"type": "object", "additionalProperties": _obj(
                                backlog=_INT, pending=_INT, bands=_ANY_OBJ)},
                            consumers={"type": "array", "items": _obj(
                                name=_STR, pending=_INT, idle_ms=_INT, last_seen_at=_NUM)},
                            throughput=_obj(added_per_s=_NUM_OR_NULL,
                                            finished_per_s=_NUM_OR_NULL, over_s=_NUM,
                                            added_total=_INT_OR_NULL,
                                            finished_total=_INT_OR_NULL),
                            throttles={"type": "array", "items": _obj(
                                site_id=_STR, target_rate=_NUM_OR_NULL,
                                delay_s=_NUM_OR_NULL, latency_ms=_NUM_OR_NULL,
                                in_flight=_INT, robots_interval_s=_NUM_OR_NULL)})),
                 **auth})},
            "/sites": {"get": _op(
                "Sites: breaker state, request rates, pauses, anomalies",
                {**_ok("One row per site", _obj(sites={"type": "array", "items": _obj(
                    site_id=_STR, breaker={"enum": [s.value for s in BreakerState]},
                    requests_per_s=_NUM, error_ratio=_NUM, in_flight=_INT,
                    paused_for_s=_NUM, anomalies=_INT)})), **auth})},
            "/history": {"get": _op(
                "The last hour, sampled by the server every interval_s (for the console's "
                "charts), and the consumers seen that have left",
                {**_ok("Samples, oldest first (a restarted server starts a new hour)", _obj(
                    interval_s=_NUM, size=_INT, error={"type": ["string", "null"]},
                    sites={"type": "array", "items": _STR, "description": "the busiest "
                           "sites of the hour, busiest first"},
                    samples={"type": "array", "items": _obj(
                        at=_NUM, backlog=_INT, pending=_INT, delayed=_INT, dead=_INT,
                        added_per_s=_NUM_OR_NULL, finished_per_s=_NUM_OR_NULL,
                        requests_per_s=_NUM, error_ratio=_NUM_OR_NULL,
                        latency_ms=_NUM_OR_NULL, sites={
                            "type": "object", "additionalProperties": _NUM,
                            "description": "requests per second of the busiest sites"})},
                    consumers_gone={"type": "array", "items": _obj(
                        name=_STR, last_seen_at=_NUM, pending=_INT)})),
                 **auth})},
            "/tasks": {"get": _op(
                "Where is the task of a URL (canonicalised and fingerprinted as the writer "
                "does; its dedup record says when it may be crawled again)",
                {**_ok("Its whole state (`state` is `not found` when no search found it)",
                       _TASK_STATE), **_problems(422), **auth},
                parameters=[{**_query("url", {"type": "string"}, "an http(s) URL"),
                             "required": True},
                            _query("site_id", _ID, "its site (else tried from what is found "
                                   "and the seed registry)")])},
            "/tasks/{task_id}": {"get": _op(
                "Where is a task: waiting, pending, delayed, done, dead or deduplicated",
                {**_ok("Its whole state (`state` is `not found` when no search found it)",
                       _TASK_STATE), **_problems(422), **auth},
                parameters=[{"name": "task_id", "in": "path", "required": True,
                             "schema": _ID},
                            _query("site_id", _ID, "its site: only that shard is searched")])},
            "/dead-letters": {"get": _op(
                "Dead letters, oldest first",
                {**_ok("A page", _obj(total=_INT, dead_letters={"type": "array",
                                                                "items": _ANY_OBJ})),
                 **_problems(422), **auth},
                parameters=[_query("site_id", _STR, "only this site's"),
                            _query("limit", {"type": "integer", "minimum": 1,
                                             "maximum": 1000}, "at most N (50)")])},
            "/dead-letters/{letter_id}": {"get": _op(
                "One dead letter in full", {**_ok("The dead letter", _ANY_OBJ),
                                            **_problems(404, 422), **auth},
                parameters=[_LETTER_PARAM])},
            "/dead-letters/{letter_id}/requeue": {"post": _op(
                "Put the task back on the stream (bypassing dedup) and drop its dead letter",
                {**_ok("Requeued", _obj(requeued=_ANY_OBJ)), **_problems(404, 409, 422),
                 **auth}, parameters=[_LETTER_PARAM])},
            **_control_paths(auth),
            **_seed_control_paths(auth),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "METEORSEED_API_TOKEN"}},
            "schemas": {"Problem": _obj(type=_STR, title=_STR, status=_INT, detail=_STR,
                                        errors={"type": "array", "items": _FIELD_ERROR})},
        },
    }


def _control_paths(auth: dict[str, Any]) -> dict[str, Any]:
    """An operator's hand on a site (api/site_control.py)."""
    site = [{"name": "site_id", "in": "path", "required": True, "schema": _STR}]
    bad = {**_problems(422), **auth}
    return {
        "/controls": {"get": _op("Held sites and overridden limits: who, when, why",
                                 {**_ok("Per site", _ANY_OBJ), **auth})},
        "/sites/{site_id}/pause": {"post": _op(
            "Hold the site fleet-wide: nothing fetched, nothing lost, until resumed",
            {**_ok("Held", _obj(site_id=_STR, held={"type": "boolean"},
                                already={"type": "boolean"})), **bad}, parameters=site)},
        "/sites/{site_id}/resume": {"post": _op(
            "Let a held site go: its parked tasks due now",
            {**_ok("Resumed", _obj(site_id=_STR, was_held={"type": "boolean"}, woken=_INT)),
             **bad}, parameters=site)},
        "/sites/{site_id}/limit": {"post": _op(
            "Set the site's rate and/or concurrency fleet-wide until reset",
            {**_ok("Set", _ANY_OBJ), **bad}, parameters=site,
            requestBody={"required": True, "content": {"application/json": {"schema": _obj(
                rate=_NUM, concurrency=_INT, reset={"type": "boolean"})}}})},
    }


def _seed_control_paths(auth: dict[str, Any]) -> dict[str, Any]:
    """An operator's hand on a seed (api/seed_control.py)."""
    seed = [{"name": "seed_id", "in": "path", "required": True, "schema": _STR}]
    bad = {**_problems(422), **auth}
    return {
        "/seed-controls": {"get": _op("Held and cancelled seeds: who, when, why",
                                      {**_ok("Per seed", _ANY_OBJ), **auth})},
        "/seeds/{seed_id}/pause": {"post": _op(
            "Hold the seed fleet-wide: none of its tasks fetched, nothing lost, until resumed",
            {**_ok("Held", _obj(seed_id=_STR, held={"type": "boolean"},
                                already={"type": "boolean"})), **bad}, parameters=seed,
            requestBody={"required": False, "content": {"application/json": {
                "schema": _obj(reason=_STR)}}})},
        "/seeds/{seed_id}/resume": {"post": _op(
            "Let a held seed go: its parked tasks due now",
            {**_ok("Resumed", _obj(seed_id=_STR, was_held={"type": "boolean"}, woken=_INT)),
             **bad}, parameters=seed)},
        "/seeds/{seed_id}/cancel": {"post": _op(
            "Cancel the seed: its waiting and delayed tasks removed and counted, in-flight "
            "ones finish",
            {**_ok("Cancelled", _obj(seed_id=_STR, cancelled={"type": "boolean"},
                                     removed=_obj(waiting=_INT, delayed=_INT))), **bad},
            parameters=seed)},
    }
