"""Errors as RFC 9457 problem documents (``application/problem+json``), one middleware.

Every error the API returns has the same shape: ``type``, ``title``, ``status``, ``detail``
and, for bad input, ``errors``: a list of ``{"field": "seeds[2].payload.urls[5]",
"problem": "..."}``. Redis being down is a 503 with the reason, never a crash or a hang.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from redis.exceptions import RedisError

from meteorseed_scrapy.api.config import CONFIG
from meteorseed_scrapy.queue.plumbing.connection import REDIS_DOWN
from meteorseed_scrapy.task.json_depth import loads_bounded
from meteorseed_scrapy.task.validation import TaskError, unknown_keys

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class FieldError:
    """One rejected input: ``field`` is its path in the request (``seeds[0].payload.urls[3]``,
    ``query.limit``; ``body`` for the body as a whole)."""

    field: str
    problem: str

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "problem": self.problem}


def unknown_fields(body: Mapping[str, Any], known: Collection[str], what: str
                   ) -> list[FieldError]:
    """Each field of ``body`` outside ``known``, as every input refuses an unknown key
    (:func:`~meteorseed_scrapy.task.validation.unknown_keys`), for a 422 that lists them."""
    return [FieldError(e.field, e.problem) for e in unknown_keys(body, known, "", what)]


class InvalidInput(Exception):
    """Raised by a handler for a 422 naming each bad field."""

    def __init__(self, errors: list[FieldError], detail: str = "the request has invalid fields"
                 ) -> None:
        super().__init__(detail)
        self.errors = errors
        self.detail = detail


def json_body(body: bytes) -> Any:
    """A request body's JSON; InvalidInput naming ``body`` (and where it breaks) otherwise."""
    try:
        return loads_bounded("body", body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidInput([FieldError("body", f"is not valid UTF-8 (byte {exc.start})")],
                           "the body is not JSON") from None
    except TaskError as exc:  # nested too deeply (the same on every Python), or a key twice
        raise InvalidInput([FieldError(exc.field, exc.problem)]) from None
    except ValueError as exc:
        where = f" at line {exc.lineno} column {exc.colno}" \
            if isinstance(exc, json.JSONDecodeError) else ""
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InvalidInput([FieldError("body", f"is not valid JSON ({reason}{where})")],
                           "the body is not JSON") from None


def problem(status: int, detail: str, *, title: str | None = None,
            headers: dict[str, str] | None = None, **extra: Any) -> web.Response:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title or _reason(status),
        "status": status,
        "detail": detail,
        **extra,
    }
    return web.Response(status=status, text=json.dumps(body, ensure_ascii=False),
                        content_type=PROBLEM_JSON, headers=headers)


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def invalid(errors: list[FieldError], detail: str, **extra: Any) -> web.Response:
    return problem(422, detail, errors=[e.to_json() for e in errors], **extra)


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except InvalidInput as exc:
        return invalid(exc.errors, exc.detail)
    except web.HTTPRequestEntityTooLarge as exc:
        return problem(413, f"the request body is larger than the limit of "
                            f"{request.app[CONFIG].max_body} bytes", headers=_kept(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects
        detail = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else (
            f"{request.method} {request.path}: {exc.reason.lower()}")
        return problem(exc.status, detail, headers=_kept(exc))
    except REDIS_DOWN as exc:
        logger.warning("Redis unavailable for %s %s: %s", request.method, request.path, exc)
        return problem(503, f"Redis is unavailable: {exc}", headers={"Retry-After": "5"})
    except RedisError as exc:
        logger.error("Redis error for %s %s: %s", request.method, request.path, exc)
        return problem(503, f"Redis error: {exc}", headers={"Retry-After": "5"})
    except Exception:  # a bug: logged in full, answered as a problem document
        logger.exception("Error handling %s %s", request.method, request.path)
        return problem(500, "internal error (see the server log)")


def _kept(exc: web.HTTPException) -> dict[str, str]:
    # Allow (405) and WWW-Authenticate (401) must survive the rewrite into a problem document.
    return {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
