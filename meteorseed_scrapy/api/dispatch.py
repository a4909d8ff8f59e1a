"""``POST /dispatch``: validate seeds, register them, expand them into the realtime lane.

The body is one seed (a JSON object, field paths ``payload.urls[3]``), a list of seeds or
``{"seeds": [...]}`` (field paths ``seeds[2].payload.urls[3]``). A bad seed is rejected alone
and a bad URL inside a good seed alone: the rest goes through (202, with counts and the
rejections); when nothing at all is accepted the answer is a 422 listing every rejection.

``url_list`` seeds (at most 10 000 URLs, checked) are expanded before the answer, whose counts
are final. Templates, keywords and sitemaps may be large or slow: they expand in the background
and the answer gives the counts so far plus ``href`` (``GET /seeds/{id}``) to follow them. At
most ``max_expansions`` run in the background at once: a request that would start more is
answered 503 with Retry-After, and nothing of it is registered.

A sitemap seed's own URL must be inside its site's allowed domains (when the site has rules)
and, unless ``METEORSEED_FETCH_PRIVATE_ADDRESSES``, must not be a literal private address (a
host name is resolved and checked when the sitemap is fetched).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from meteorseed_scrapy.api.expansion import (
    MAX_LISTED_ERRORS,
    RETRY_AFTER_S,
    ExpansionState,
    Progress,
    expand_seed,
)
from meteorseed_scrapy.api.problems import (
    FieldError,
    InvalidInput,
    json_body,
    problem,
    unknown_fields,
)
from meteorseed_scrapy.api.state import STATE, ApiState
from meteorseed_scrapy.observability.webhook import literal_refusal
from meteorseed_scrapy.seeding.addresses import POLICY_META_KEY, PUBLIC_ONLY, literal_problem
from meteorseed_scrapy.seeding.fetch import FetchPolicy
from meteorseed_scrapy.seeding.seed_urls import check_payload
from meteorseed_scrapy.task.seed_task import SeedTask
from meteorseed_scrapy.task.validation import TaskError

logger = logging.getLogger(__name__)

#: Seeds in one request (each is validated and registered before the answer).
MAX_SEEDS_PER_REQUEST = 1000
#: Task types expanded before the answer (bounded by the 10 000 URLs of a line).
INLINE_TYPES = frozenset({"url_list"})
#: Seconds a dispatched seed stays leased (renewed while it expands) so no seeder runs it too.
LEASE_S = 300.0
#: Dispatched tasks go to the realtime lane, ahead of scheduled re-crawls.
LANE = "realtime"


def parse_body(body: bytes) -> tuple[list[Any], bool]:
    """The seeds of a request body and whether they came as a list; raises InvalidInput."""
    data = json_body(body)
    if isinstance(data, dict) and "seeds" in data:  # (no seed has a field of that name)
        extra = unknown_fields(data, {"seeds"}, 'a field of {"seeds": [...]}')
        if extra:
            raise InvalidInput(extra)
        data = data["seeds"]
        if not isinstance(data, list):
            raise InvalidInput([FieldError("seeds", "must be a list of seeds")])
    if isinstance(data, dict):
        return [data], False
    if not isinstance(data, list):
        raise InvalidInput([FieldError("body", "must be a seed object, a list of seeds or "
                                               '{"seeds": [...]}')])
    if not data:
        raise InvalidInput([FieldError("seeds", "must not be empty")])
    if len(data) > MAX_SEEDS_PER_REQUEST:
        raise InvalidInput([FieldError("seeds", f"has {len(data)} seeds, more than the limit "
                                                f"of {MAX_SEEDS_PER_REQUEST} per request")])
    return data, True


def validate_seed(data: Any, prefix: str) -> SeedTask:
    """One seed of the body, validated as ``seed-expand`` validates a line; raises
    InvalidInput naming the field under ``prefix``."""
    where = prefix.rstrip(".") or "seed"
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput([FieldError(where, "holds an unpaired surrogate escape "
                                              "(\\ud800-\\udfff)")]) from None
    if isinstance(data, dict) and "lane" not in data:
        data = {**data, "lane": LANE}  # a seed may still name its lane itself
    try:
        seed = SeedTask.from_dict(data)
        check_payload(seed)
    except TaskError as exc:
        field = exc.field if exc.field != "seed" else ""
        raise InvalidInput([FieldError(f"{prefix}{field}".rstrip(".") or where, exc.problem)]
                           ) from None
    except TypeError as exc:  # e.g. a list as task_type: unhashable
        raise InvalidInput([FieldError(where, f"is not a valid seed ({exc})")]) from None
    return seed


async def dispatch(request: web.Request) -> web.Response:
    state = request.app[STATE]
    items, as_list = parse_body(await request.read())
    errors: list[FieldError] = []
    accepted: list[tuple[int, str, SeedTask]] = []
    seen_ids: set[str] = set()
    await state.rules.refresh()
    for index, data in enumerate(items):
        prefix = f"seeds[{index}]." if as_list else ""
        try:
            seed = validate_seed(data, prefix)
        except InvalidInput as exc:
            errors.extend(exc.errors)
            continue
        refused = (_sitemap_problem(state, seed, prefix) or _url_list_problem(state, seed, prefix)
                   or _notify_problem(state, seed, prefix))
        if refused is not None:
            errors.append(refused)
        elif seed.seed_id in seen_ids:
            errors.append(FieldError(f"{prefix}seed_id", f"{seed.seed_id!r} appears twice in "
                                                         "this request"))
        elif state.expansions.running(seed.seed_id):
            errors.append(FieldError(f"{prefix}seed_id", f"{seed.seed_id!r} is still being "
                                     f"expanded (GET /seeds/{seed.seed_id})"))
        else:
            seen_ids.add(seed.seed_id)
            # Workers fetch its tasks and their redirects from public addresses only (their
            # METEORSEED_FETCH_PRIVATE_ADDRESSES aside): meteorseed_scrapy/address_policy.py
            seed = dataclasses.replace(seed, meta={**seed.meta, POLICY_META_KEY: PUBLIC_ONLY})
            accepted.append((index, prefix, seed))
    if not accepted:
        raise InvalidInput(errors, "no seed was accepted")
    if any(seed.task_type in INLINE_TYPES for _, _, seed in accepted):
        # An inline expansion would hold the request until workers catch up: say so instead.
        backlog = await state.writer.backlog()
        if backlog > state.config.max_backlog:
            return problem(503, f"{backlog} tasks are waiting, more than the limit of "
                                f"{state.config.max_backlog} (METEORSEED_MAX_BACKLOG): retry "
                                "when workers have caught up", headers={"Retry-After": "30"})
    background = sum(seed.task_type not in INLINE_TYPES for _, _, seed in accepted)
    if background and not state.pool.reserve(background):
        return problem(503, f"{state.pool.running} background expansions are running and this "
                            f"request would start {background} more, above the limit of "
                            f"{state.pool.size}: retry when some have finished (GET /seeds)",
                       headers={"Retry-After": str(RETRY_AFTER_S)})
    # Taken before the first await, so a concurrent request cannot start the same seed too.
    reserved = [Progress(seed.seed_id) for _, _, seed in accepted]
    for progress in reserved:
        state.expansions.add(progress)
    started: list[tuple[dict[str, Any], Progress]] = []
    try:
        for (index, prefix, seed), progress in zip(accepted, reserved, strict=True):
            line, _, holds_slot = await _start(state, index, prefix, seed, progress)
            background -= holds_slot  # released when its expansion ends
            started.append((line, progress))
    finally:
        state.pool.release(background)  # slots of background seeds that did not start
        for progress in reserved:  # not started (Redis down): free the seed_id again
            if progress.state is ExpansionState.EXPANDING and not state.expansions.has_task(
                    progress.seed_id):
                progress.finish(ExpansionState.FAILED, "not started: the request failed")
    totals = {"enqueued": 0, "duplicates": 0, "rejected_urls": 0}
    for _line, progress in started:
        totals["enqueued"] += progress.enqueued
        totals["duplicates"] += progress.duplicates
        totals["rejected_urls"] += progress.rejected
        errors.extend(progress.errors)
    listed = errors[:MAX_LISTED_ERRORS]
    return web.json_response({
        "accepted": len(accepted),
        "rejected_seeds": len(items) - len(accepted),
        **totals,
        "seeds": [line for line, _progress in started],
        "errors": [e.to_json() for e in listed],
        "errors_truncated": len(errors) > len(listed),
    }, status=202)


def _sitemap_problem(state: ApiState, seed: SeedTask, prefix: str) -> FieldError | None:
    """Why a sitemap seed's own URL may not be fetched, as far as can be told without DNS."""
    if seed.task_type != "sitemap":
        return None
    url = str(seed.payload.get("url"))
    policy = FetchPolicy.for_site(seed.site_id, state.rules.get(seed.site_id))
    problem = policy.domain_problem(url) or literal_problem(
        url, state.config.fetch_private_addresses)
    return None if problem is None else FieldError(f"{prefix}payload.url", problem)


def _url_list_problem(state: ApiState, seed: SeedTask, prefix: str) -> FieldError | None:
    """The first URL of a url_list seed that is a literal non-public address (names are
    checked by the workers, resolved: address_policy.py)."""
    if seed.task_type != "url_list" or state.config.fetch_private_addresses:
        return None
    for index, url in enumerate(seed.payload.get("urls") or ()):
        problem = literal_problem(str(url))
        if problem is not None:
            return FieldError(f"{prefix}payload.urls[{index}]", problem)
    return None


def _notify_problem(state: ApiState, seed: SeedTask, prefix: str) -> FieldError | None:
    """Why the seed's webhook may not be called, as far as can be told without DNS."""
    notify = state.config.notify
    problem = None if seed.notify is None else literal_refusal(
        seed.notify, notify is not None and notify.private_addresses)
    return None if problem is None else FieldError(f"{prefix}notify", problem)


async def _start(state: ApiState, index: int, prefix: str, seed: SeedTask,
                 progress: Progress) -> tuple[dict[str, Any], Progress, bool]:
    """Register ``seed`` and expand it (now, or in the background); its line of the answer,
    and whether a background expansion started (it releases its pool slot when it ends)."""
    try:
        record = await state.registry.put(seed)
    except TaskError as exc:  # e.g. deleted by another client while being registered
        progress.reject(f"{prefix}{exc.field}", exc.problem)
        progress.finish(ExpansionState.FAILED, str(exc))
        return _line(index, seed, progress), progress, False
    # A registered seed is due at once: hold its lease while this server expands it, so a
    # seeder does not run it a second time; record_run then schedules its next run (if any).
    await state.registry.renew(seed.seed_id, LEASE_S)
    coro = _run(state, seed, record.rev, prefix, progress)
    if seed.task_type in INLINE_TYPES:
        await coro
        return _line(index, seed, progress), progress, False
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda _: state.pool.release())
    state.expansions.attach(seed.seed_id, task)
    return _line(index, seed, progress), progress, True


def _line(index: int, seed: SeedTask, progress: Progress) -> dict[str, Any]:
    return {
        "index": index,
        "seed_id": seed.seed_id,
        "state": progress.state.value,
        "enqueued": progress.enqueued,
        "duplicates": progress.duplicates,
        "rejected": progress.rejected,
        "href": f"/seeds/{seed.seed_id}",
    }


async def _run(state: ApiState, seed: SeedTask, rev: int, prefix: str,
               progress: Progress) -> None:
    started = time.time()

    async def keep_lease() -> None:
        await state.registry.renew(seed.seed_id, LEASE_S)

    try:
        outcome, error = await expand_seed(
            seed, prefix, progress, state.writer, state.rules, state.config.max_backlog,
            keep_lease, pool=None if seed.task_type in INLINE_TYPES else state.pool,
            private_addresses=state.config.fetch_private_addresses)
    except asyncio.CancelledError:
        progress.finish(ExpansionState.CANCELLED, "cancelled (seed deleted or server stopping)")
        # Hand it back to the seeders (a deleted seed is not in the due set: a no-op).
        await _quietly(state.registry.renew(seed.seed_id, 0))
        raise
    except Exception as exc:  # Redis down half-way: keep the counts, say why
        logger.warning("Expansion of seed %s failed after %d tasks: %s", seed.seed_id,
                       progress.enqueued, exc)
        try:
            await _record(state, seed.seed_id, started, rev, progress, False, str(exc))
        finally:
            progress.finish(ExpansionState.FAILED, f"{type(exc).__name__}: {exc}")
        if seed.task_type in INLINE_TYPES:
            raise
        return
    # Recorded first: whoever sees the expansion finished sees its run in the registry.
    try:
        await _record(state, seed.seed_id, started, rev, progress,
                      outcome is ExpansionState.DONE, error)
    finally:
        progress.finish(outcome, error)


async def _record(state: ApiState, seed_id: str, started: float, rev: int,
                  progress: Progress, ok: bool, error: str | None) -> None:
    await _quietly(state.registry.record_run(
        seed_id, started_at=started, ok=ok, error=error, new_urls=progress.enqueued,
        duplicates=progress.duplicates, rejected=progress.rejected, rev=rev))


async def _quietly(call: Awaitable[Any]) -> None:
    try:
        await call
    except Exception as exc:  # the registry shares Redis: it may be down too
        logger.warning("Cannot update the seed registry: %s", exc)
