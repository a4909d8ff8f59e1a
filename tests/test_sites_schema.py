"""Site rule configs: validation errors, processors, extraction and constraint checks."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from parsel import Selector

from meteorseed_scrapy.sites.extract import extract
from meteorseed_scrapy.sites.model import SiteConfig
from meteorseed_scrapy.sites.processors import PageContext, ProcessorError, make_date, make_float
from meteorseed_scrapy.sites.quality import check
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.rulefile import load_file
from meteorseed_scrapy.sites.schema import parse_site

EXAMPLES = Path(__file__).resolve().parents[1] / "example_project" / "sites"
NOW = datetime(2025, 6, 1, tzinfo=timezone.utc)


def base(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "site_id": "news", "version": 1,
        "list": {"links": "a.article::attr(href)", "pagination": "a.next::attr(href)"},
        "fields": {"title": "h1::text", "published": {
            "css": "time::text", "processors": [{"date": {"formats": ["%d.%m.%Y %H:%M"],
                                                          "tz": "Europe/Berlin"}}]}},
        "required": ["title"],
    }
    config.update(overrides)
    return config


def test_example_sites_load() -> None:
    sites = {p.name: load_file(p) for p in sorted(EXAMPLES.iterdir())}
    assert {c.site_id for c in sites.values()} == {"example_news", "example_shop",
                                                   "example_jobs", "example_quotes"}
    quotes = sites["quotes.yaml"]
    assert (quotes.rendering.mode, quotes.rendering.wait_for) == ("browser", "div.quote")
    jobs = sites["jobs.json"]
    assert jobs.format == "json" and jobs.unique_key == "job_id"
    news = sites["news.yaml"]
    assert news.dedup.mode == "mark" and news.dedup.window == 30 * 86400
    assert news.limits.rate == 50 and news.limits.retries == 2
    assert news.recrawl_after == 86400 and news.rendering.mode == "none"
    assert news.follow.canonicalize and not news.follow.skip_nofollow
    assert "pdf" in news.follow.deny_extensions
    assert not news.allows("http://127.0.0.1:8000/login") and news.allows("http://localhost/x")
    assert not news.allows("http://elsewhere.example/news/1")


@pytest.mark.parametrize(("change", "path", "problem"), [
    ({"site_id": None}, "site_id", "is required"),
    ({"site_id": "bad id"}, "site_id", "letters, digits"),
    ({"pagnation": "a"}, "pagnation", "unknown key"),
    ({"list": {"links": "a::attr(href"}}, "list.links.css", "invalid selector"),
    ({"list": {"links": {"css": "a", "xpath": "//a"}}}, "list.links", "exactly one of"),
    ({"fields": {"title": {"css": "h1", "processors": ["float", "shout"]}}},
     "fields.title.processors[1]", "unknown processor 'shout'"),
    ({"fields": {"t": {"css": "t", "processors": [{"date": {"tz": "Mars/Base"}}]}}},
     "fields.t.processors[0].date.tz", "unknown time zone"),
    ({"fields": {"site_id": "h1::text"}}, "fields.site_id", "reserved"),
    ({"required": ["body"]}, "required", "'body'"),
    ({"unique_key": "sku"}, "unique_key", "must be 'url' or a field name"),
    ({"limits": {"rate": -1}}, "limits.rate", "positive finite number"),
    ({"limits": {"concurrency": 1.5}}, "limits.concurrency", "whole number"),
    ({"rendering": {"mode": "browser"}}, "rendering.wait_for", "required when mode is browser"),
    ({"rendering": {"mode": "chrome"}}, "rendering.mode", "must be one of"),
    ({"recrawl_after": "soon"}, "recrawl_after", "duration"),
    ({"blacklist": ["("]}, "blacklist", "invalid regular expression"),
    ({"proxies": ["ftp://p"]}, "proxies", "http(s)://"),
    ({"dedup": {"mode": "mark", "content": "body"}}, "dedup.content", "not among the fields"),
    ({"format": "json", "list": {"items": "jobs"}, "fields": {"title": "title"}},
     "unique_key", "name a field"),
    ({"format": "json", "fields": {"title": {"css": "h1"}}}, "fields.title.css", "use path"),
    ({"format": "json", "list": {"links": {"jmespath": "jobs[?"}}, "fields": {"title": "t"}},
     "list.links.jmespath", "invalid JMESPath"),
    ({"fields": {"title": {"jmespath": "title"}}}, "fields.title.jmespath",
     "only for format: json"),
    ({"fields": {"title": {"path": "a.b", "jmespath": "a.b"}}}, "fields.title",
     "exactly one of css, xpath, path, jmespath, from_url"),
    ({"follow": {"skip_nofollow": "yes"}}, "follow.skip_nofollow", "true or false"),
    ({"follow": {"deny_extensions": [""]}}, "follow.deny_extensions[0]", "non-empty string"),
    ({"follow": {"nofollow": True}}, "follow.nofollow", "unknown key"),
    ({"fields": {"p": {"css": "p", "processors": [{"price": {"part": "cents"}}]}}},
     "fields.p.processors[0].price.part", "must be one of both, amount, currency"),
    ({"fields": {"p": {"css": "p", "processors": [{"float": {"decimal": "."}, "int": {}}]}}},
     "fields.p.processors[0]", "expected a processor name"),
])
def test_errors_name_file_path_and_problem(change: dict[str, Any], path: str,
                                           problem: str) -> None:
    with pytest.raises(RuleError) as info:
        parse_site(base(**change), "sites/news.yaml")
    assert info.value.source == "sites/news.yaml"
    assert info.value.path == path
    assert problem in info.value.problem
    assert str(info.value).startswith(f"sites/news.yaml: {path}: ")


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("site_id: [unclosed\n")
    with pytest.raises(RuleError, match=r"x\.yaml: <top>: not valid YAML"):
        load_file(bad)


def test_an_unquoted_off_in_yaml_says_to_quote_it(tmp_path: Path) -> None:
    rules = tmp_path / "news.yaml"
    rules.write_text((EXAMPLES / "news.yaml").read_text()
                     .replace("mode: mark", "mode: off"))
    with pytest.raises(RuleError) as info:
        load_file(rules)
    assert info.value.path == "dedup.mode"
    assert 'quote the word ("off")' in info.value.problem


def test_utc_timestamps_keep_one_width_for_early_years() -> None:
    from meteorseed_scrapy.store.documents import utc_timestamp
    early = utc_timestamp(datetime(5, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc))
    assert early == "0005-01-02T03:04:05.000006Z"
    assert len(early) == len(utc_timestamp()) and early < utc_timestamp()


@pytest.mark.parametrize(("text", "decimal", "expected"), [
    ("1,299.00", ".", 1299.0), ("Price: 12,345,678.5 EUR", ".", 12345678.5),
    ("1.299,00", ",", 1299.0), ("1\u00a0299,50 €", ",", 1299.5), ("7", ".", 7.0),
])
def test_float_drops_thousands_separators(text: str, decimal: str, expected: float) -> None:
    assert make_float(decimal)(text, PageContext("http://x/")) == expected


def test_float_without_a_number_fails() -> None:
    with pytest.raises(ProcessorError, match="no number"):
        make_float()("call us", PageContext("http://x/"))


def test_dates_become_iso_utc() -> None:
    from zoneinfo import ZoneInfo

    berlin = make_date(("%d.%m.%Y %H:%M",), ZoneInfo("Europe/Berlin"))
    assert berlin("02.07.2024  14:30", PageContext("")) == "2024-07-02T12:30:00Z"  # CEST, +2
    assert berlin("02.01.2024 14:30", PageContext("")) == "2024-01-02T13:30:00Z"  # CET, +1
    iso = make_date((), timezone.utc)
    assert iso("2024-07-02T14:30:00+05:00", PageContext("")) == "2024-07-02T09:30:00Z"
    with pytest.raises(ProcessorError, match="matches none of"):
        berlin("yesterday", PageContext(""))


HTML = """<html><body><nav>Home | World</nav>
<article><h1> Big   news\n today </h1><time>02.07.2024 14:30</time>
<div class="body"><p>First <b>para</b>.</p><script>var x = 1;</script><style>p{}</style>
<iframe>ad</iframe><p>Second para.</p><div class="share">Share this</div></div>
<a class="more" href="../more/1?x=1">more</a></article><footer>(c) News</footer></body></html>"""


def test_extract_normalises_and_cleans_content() -> None:
    config = parse_site(base(fields={
        "title": "h1::text",
        "published": base()["fields"]["published"],
        "body": {"css": ".body", "text": True},
        "page": {"css": "body", "text": True},
        "more": {"css": "a.more::attr(href)", "processors": ["absolute_url"]},
        "paras": {"css": ".body p::text", "many": True},
    }, detail={"remove": ["nav", "footer", ".share"]}), "t.yaml")
    sel = Selector(text=HTML)
    removed = {node.root for css in config.remove for node in sel.css(css)}
    parsed = extract(config.fields, sel, "http://site.example/a/b/c", removed)
    assert parsed.fields["title"] == "Big news today"
    assert parsed.raw["title"] == "Big news today"
    assert parsed.fields["published"] == "2024-07-02T12:30:00Z"
    assert parsed.raw["published"] == "02.07.2024 14:30"
    assert parsed.fields["body"] == "First para. Second para."
    assert "var x" not in parsed.fields["page"] and "Home" not in parsed.fields["page"]
    assert "(c) News" not in parsed.fields["page"] and "Share" not in parsed.fields["page"]
    assert parsed.fields["more"] == "http://site.example/a/more/1?x=1"
    assert parsed.fields["paras"] == ["First", ".", "Second para."]  # <p> text nodes only
    assert parsed.problems == []


def _check(config: SiteConfig, **fields: Any) -> list[str]:
    from meteorseed_scrapy.sites.extract import Parsed

    return check(config, Parsed(fields=fields), now=NOW)


def test_constraints_and_required_fields() -> None:
    config = parse_site(base(fields={
        "title": {"css": "h1::text", "min_length": 5, "max_length": 20},
        "published": base()["fields"]["published"],
        "price": {"css": ".p::text", "processors": ["float"], "min": 0},
    }), "t.yaml")
    assert _check(config, title="A fine title", published="2024-07-02T12:30:00Z",
                  price=3.5) == []
    assert _check(config, title="", published=None, price=None) == [
        "title: required but empty"]
    reasons = _check(config, title="Tiny", published="1989-12-31T00:00:00Z", price=-1.0)
    assert reasons == ["title: shorter than 5 (4)", "published: before 1990-01-01"
                       " (1989-12-31T00:00:00Z)", "price: below 0 (-1.0)"]
    assert _check(config, title="A fine title", published="2030-01-01T00:00:00Z") == [
        "published: in the future (2030-01-01T00:00:00Z)"]


def test_processor_failure_is_a_reason_not_a_crash() -> None:
    config = parse_site(base(fields={"title": "h1::text", "price": {
        "css": "time::text", "processors": ["float"]}}), "t.yaml")
    parsed = extract(config.fields, Selector(text="<h1>T</h1><time>n/a</time>"), "http://x/")
    assert parsed.fields["price"] is None
    assert check(config, parsed) == ["price: float: no number in 'n/a'"]


def test_follow_settings() -> None:
    config = parse_site(base(follow={"canonicalize": False, "skip_nofollow": True,
                                     "deny_extensions": [".PDF", "zip"]}), "t.yaml")
    assert (config.follow.canonicalize, config.follow.skip_nofollow) == (False, True)
    assert config.follow.deny_extensions == frozenset({"pdf", "zip"})
    assert parse_site(base(follow={"deny_extensions": []}), "t.yaml").follow.deny_extensions \
        == frozenset()


def test_natural_dates_get_date_constraints_by_default() -> None:
    pytest.importorskip("dateparser")
    config = parse_site(base(fields={"title": "h1::text", "when": {
        "css": "time::text", "processors": [{"date_natural": {"languages": ["fr"]}}]}}),
        "t.yaml")
    when = config.fields[1].constraint
    assert when.not_future and when.not_before is not None
