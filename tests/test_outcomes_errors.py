"""Which errors of the spider's code may pass (its task delivered again) and which are bugs
(its task dead-lettered at once, its page not fetched again): ``outcomes.transient``."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
import redis

from meteorseed_scrapy.store.base import StoreUnavailable
from meteorseed_scrapy.store.documents import DocumentError
from meteorseed_scrapy.worker.fate import transient


def _from(error: Exception, cause: Exception, *, implicit: bool = False) -> Exception:
    if implicit:
        error.__context__ = cause
    else:
        error.__cause__ = cause
    return error


@pytest.mark.parametrize("error", [
    StoreUnavailable("SQLite: database is locked"),
    _from(RuntimeError("document 'a' was not committed"), StoreUnavailable("down")),
    _from(ValueError("wrapped while handling"), ConnectionResetError(), implicit=True),
    ConnectionRefusedError(), TimeoutError(), asyncio.TimeoutError(),
    redis.exceptions.ConnectionError("gone"), redis.exceptions.TimeoutError("slow"),
])
def test_errors_that_may_pass(error: Exception) -> None:
    assert transient(error)


@pytest.mark.parametrize("error", [
    ValueError("boom"), KeyError("price"), TypeError("NoneType"), AttributeError("x"),
    DocumentError("unique_key", "too long"), sqlite3.IntegrityError("constraint"),
    FileNotFoundError("missing.csv"), redis.exceptions.ResponseError("WRONGTYPE"),
    _from(RuntimeError("not committed"), sqlite3.IntegrityError("constraint")),
    None,
])
def test_bugs_that_a_redelivery_would_meet_again(error: Exception | None) -> None:
    assert not transient(error)


def test_a_cycle_of_causes_ends() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert not transient(a)
