"""``meteorseed export``: JSON Lines from the store, a cursor to resume from, every document
once across an interruption, changed documents again; a bad cursor refused naming ``--since``.

SQLite, a real PostgreSQL (started by the tests) and mongomock-ng.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meteorseed_scrapy.cli import export as export_cli
from meteorseed_scrapy.cli import main
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.documents import build_document
from meteorseed_scrapy.store.export_cursor import decode_cursor, encode_cursor


def _doc(key: str, site: str = "news", seed: str = "s1", **fields: Any) -> dict[str, Any]:
    return build_document(fields, site_id=site, url=f"https://{site}.example/{key}",
                          seed_id=seed, task_id="t", unique_key=key)


@pytest.fixture(params=["sqlite", "postgres", "mongomock"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/items.db"
    elif request.param == "postgres":
        yield request.getfixturevalue("postgres_uri")
    else:
        yield f"mongomock://{uuid.uuid4().hex}/db"


def _export(*args: str) -> tuple[int, list[dict[str, Any]], str, str]:
    """Exit code, the documents written to stdout, the cursor printed, all of stderr."""
    out, err = io.StringIO(), io.StringIO()
    code = main(["export", *args], stdout=out, stderr=err)
    lines = err.getvalue().splitlines()
    cursor = lines[-1].removeprefix("cursor=") if lines and lines[-1].startswith("cursor=") \
        else ""
    return code, [json.loads(line) for line in out.getvalue().splitlines()], cursor, \
        err.getvalue()


def _fill(uri: str, docs: list[dict[str, Any]]) -> None:
    with open_store(uri) as store:
        store.upsert_many(docs)


def test_interrupted_export_resumes_with_every_document_once(uri: str) -> None:
    _fill(uri, [_doc(f"a{i:02d}", title="é\u202e") for i in range(30)])
    code, first, cursor, err = _export("--store-uri", uri, "--limit", "12")
    assert code == 0 and len(first) == 12 and cursor, err
    assert "exported 12 document(s)" in err
    code, rest, cursor2, _ = _export("--store-uri", uri, "--since", cursor)
    assert code == 0
    ids = [d["_id"] for d in first + rest]
    assert sorted(ids) == sorted(f"news:a{i:02d}" for i in range(30))
    assert len(ids) == len(set(ids))  # once each
    assert rest[0]["title"] == "é\u202e"
    # Nothing new: nothing out, the same cursor back (a cron job may always pass the last).
    code, none, cursor3, _ = _export("--store-uri", uri, "--since", cursor2)
    assert (code, none, cursor3) == (0, [], cursor2)
    # An update after the cursor comes again; a new document too; the rest do not.
    _fill(uri, [_doc("a03", title="new"), _doc("b00")])
    code, again, _, _ = _export("--store-uri", uri, "--since", cursor2)
    assert [(d["_id"], d.get("title")) for d in again] == [("news:a03", "new"), ("news:b00", None)]


def test_site_and_seed_filters_and_output_file(uri: str, tmp_path: Path) -> None:
    _fill(uri, [_doc("a"), _doc("b", site="shop"), _doc("c", seed="s2")])
    target = tmp_path / "out.jsonl"
    code, stdout_docs, _, _ = _export("--store-uri", uri, "--site", "shop", "-o", str(target))
    assert code == 0 and stdout_docs == []
    assert [json.loads(line)["_id"] for line in target.read_text().splitlines()] == ["shop:b"]
    code, docs, _, _ = _export("--store-uri", uri, "--seed", "s2")
    assert [d["_id"] for d in docs] == ["news:c"]


class _FailingAfter:
    """A store whose ``export_page`` fails after ``pages`` pages: an export cut off midway."""

    def __init__(self, inner: Store, pages: int) -> None:
        self.inner, self.pages = inner, pages
        self.export_kind = inner.export_kind

    def export_page(self, *args: Any, **kwargs: Any) -> Any:
        if self.pages == 0:
            raise StoreUnavailable("the server went away")
        self.pages -= 1
        return self.inner.export_page(*args, **kwargs)

    def close(self) -> None:
        self.inner.close()


def test_cursor_file_resumes_after_the_last_page_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"sqlite:///{tmp_path}/items.db"
    _fill(uri, [_doc(f"a{i:02d}") for i in range(23)])
    monkeypatch.setattr(export_cli, "PAGE", 5)
    monkeypatch.setattr(export_cli, "open_store",
                        lambda *a: _FailingAfter(open_store(*a), 2))  # type: ignore[arg-type]
    cursor_file, target = tmp_path / "cursor", tmp_path / "out.jsonl"
    args = ["--store-uri", uri, "--cursor-file", str(cursor_file), "-o", str(target)]
    code, _, _, err = _export(*args)
    assert code == 2 and "unavailable" in err
    assert len(target.read_text().splitlines()) == 10  # two pages, then cut off
    monkeypatch.setattr(export_cli, "open_store", open_store)
    code, _, cursor, _ = _export(*args)  # no --since: the cursor file says where
    assert code == 0
    ids = [json.loads(line)["_id"] for line in target.read_text().splitlines()]
    assert ids == sorted(ids) and len(ids) == 23 == len(set(ids))
    assert cursor_file.read_text().strip() == cursor


NASTY = ["garbage", "=", "!!!!", "W10", "WyJzcWxpdGUiLC0xLCJhIl0", "WyJzcWxpdGUiLDEuNSwiYSJd",
         "WyJmb28iLDEsImEiXQ", "eyJhIjoxfQ", "WyJzcWxpdGUiLDEsMV0", "x" * 5000, "é",
         encode_cursor("sqlite", (2**64, "a")), "WyJzcWxpdGUiLHRydWUsImEiXQ"]


@pytest.mark.parametrize("cursor", NASTY)
def test_a_bad_cursor_is_refused_naming_since(tmp_path: Path, cursor: str) -> None:
    code, docs, _, err = _export("--store-uri", f"sqlite:///{tmp_path}/x.db", "--since", cursor)
    assert code == 2 and docs == []
    assert "--since" in err and "Traceback" not in err


def test_a_cursor_of_another_store_kind_is_refused(tmp_path: Path) -> None:
    cursor = encode_cursor("postgresql", (5, "news:a"))
    code, _, _, err = _export("--store-uri", f"sqlite:///{tmp_path}/x.db", "--since", cursor)
    assert code == 2 and "--since" in err and "postgresql" in err


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_decoding_any_text_gives_a_position_or_a_value_error(text: str) -> None:
    try:
        sequence, doc_id = decode_cursor(text, "sqlite")
    except ValueError:
        return
    assert isinstance(sequence, int) and 0 <= sequence < 2**64 and isinstance(doc_id, str)


@given(st.integers(0, 2**64 - 1), st.text(max_size=100))
def test_cursors_round_trip(sequence: int, doc_id: str) -> None:
    for kind in ("sqlite", "postgresql", "mongodb"):
        assert decode_cursor(encode_cursor(kind, (sequence, doc_id)), kind) == (sequence, doc_id)


def test_an_unwritable_output_is_one_line_naming_it(tmp_path: Path) -> None:
    code, _, _, err = _export("--store-uri", f"sqlite:///{tmp_path}/x.db",
                              "-o", str(tmp_path / "missing" / "out.jsonl"))
    assert code == 2 and "--output" in err and "Traceback" not in err
