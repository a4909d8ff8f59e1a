"""The pages of the demo site (:mod:`.sites`): deterministic per id, built from seeded words."""

from __future__ import annotations

import html
import json
import random
from collections.abc import Iterable
from datetime import date, timedelta
from functools import lru_cache
from typing import Any

PER_PAGE = 10

#: status, content type, body, extra headers
Reply = tuple[int, str, bytes, dict[str, str]]
Query = dict[str, list[str]]
HTML = "text/html; charset=utf-8"

WORDS = (
    "market", "city", "river", "council", "report", "season", "energy", "garden", "school",
    "harbour", "festival", "bridge", "museum", "railway", "forest", "island", "valley", "station",
    "library", "weather", "village", "summit", "record", "project", "science", "music", "theatre",
    "budget", "airport", "history", "coast", "tower", "storm", "harvest", "quiet", "bright",
)
FIRST = ("Ada", "Alan", "Grace", "Linus", "Margaret", "Ken", "Barbara", "Dennis", "Radia")
LAST = ("Lovelace", "Turing", "Hopper", "Torvalds", "Hamilton", "Thompson", "Liskov", "Ritchie")
_ADJ = ("Compact", "Deluxe", "Classic", "Rugged", "Smart", "Silent", "Portable", "Vintage")
_NOUN = ("Kettle", "Lamp", "Backpack", "Drone", "Speaker", "Chair", "Tent", "Camera", "Bicycle")
_ROLES = ("Python Developer", "Data Engineer", "SRE", "QA Analyst", "Product Designer")
_CITIES = ("Berlin", "Lisbon", "Oslo", "Remote", "Madrid", "Vienna")


def page_html(title: str, body: str) -> bytes:
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}'
            f"</title></head>\n<body>\n{body}\n</body></html>\n").encode()


def html_reply(title: str, body: str, status: int = 200, **headers: str) -> Reply:
    return status, HTML, page_html(title, body), headers


def listing(title: str, cls: str, items: Iterable[tuple[str, str]], extra: str = "") -> Reply:
    links = "\n".join(f'<li><a class="{cls}" href="{href}">{html.escape(text)}</a></li>'
                      for href, text in items)
    return html_reply(title, f"<h1>{html.escape(title)}</h1>\n<ul>\n{links}\n</ul>\n{extra}")


def json_reply(data: Any, status: int = 200) -> Reply:
    return status, "application/json", json.dumps(data).encode(), {}


def not_found() -> Reply:
    return html_reply("Not found", "<h1>404 Not found</h1>", 404)


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize()


@lru_cache(maxsize=2048)
def article(aid: int) -> bytes:
    rng = random.Random(f"news-article-{aid}")
    title, author = sentence(rng, 4, 8), f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    day = date(2024, 1, 1) + timedelta(days=aid)
    paragraphs = "\n".join(
        "<p>" + ". ".join(sentence(rng, 6, 14) for _ in range(4)) + ".</p>" for _ in range(4))
    return page_html(title, (
        f'<article id="article-{aid}">\n<h1 class="title">{title}</h1>\n'
        f'<p class="byline">By <span class="author">{author}</span>, '
        f'<time class="date" datetime="{day.isoformat()}">{day:%B %d, %Y}</time></p>\n'
        f'<div class="body">\n{paragraphs}\n</div>\n</article>\n'
        '<p><a href="/news/list/1">Back to the news</a></p>'))


@lru_cache(maxsize=2048)
def product(pid: int) -> bytes:
    rng = random.Random(f"shop-product-{pid}")
    name = f"{rng.choice(_ADJ)} {rng.choice(_NOUN)} {rng.randint(100, 999)}"
    price, category = rng.randint(499, 249_999) / 100, (pid - 1) // PER_PAGE + 1
    return page_html(name, (
        f'<div class="product" id="product-{pid}">\n<h1 class="name">{name}</h1>\n'
        f'<p>Price: <span class="price">{price:,.2f}</span> <span class="currency">EUR</span></p>\n'
        f'<p>SKU: <span class="sku">SKU-{pid:06d}</span></p>\n'
        f'<p class="stock">{"In stock" if rng.random() < 0.8 else "Sold out"}</p>\n'
        f"<p>{sentence(rng, 10, 20)}.</p>\n</div>\n"
        f'<p><a href="/shop/category/{category}">Back to category {category}</a></p>'))


def job(jid: int) -> dict[str, Any]:
    rng = random.Random(f"jobs-{jid}")
    low = rng.randint(40, 90) * 1000
    return {
        "id": jid,
        "title": rng.choice(("Junior ", "", "Senior ", "Lead ")) + rng.choice(_ROLES),
        "company": f"{rng.choice(LAST)} {rng.choice(('GmbH', 'Ltd', 'S.A.', 'AS'))}",
        "location": rng.choice(_CITIES),
        "salary": {"min": low, "max": low + rng.randint(5, 30) * 1000, "currency": "EUR"},
        "posted": (date(2024, 6, 1) + timedelta(days=jid % 90)).isoformat(),
    }


__all__ = ["FIRST", "HTML", "LAST", "PER_PAGE", "WORDS", "Query", "Reply", "article",
           "html_reply", "job", "json_reply", "listing", "not_found", "page_html", "product",
           "sentence"]
