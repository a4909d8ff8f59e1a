"""The ``js`` section of the demo site: pages whose content only exists after JavaScript runs.

``/js/quotes/<page>`` is an empty shell whose script fetches ``/js/api/quotes?page=<page>`` and
inserts 10 ``div.quote`` elements (text, author, tags, date) and, but on the last page, an
``a.next`` link. Without a browser there is nothing to parse: the HTML as served holds no quote.
"""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

PER_PAGE = 10
_PEOPLE = ("Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov",
           "Donald Knuth", "Frances Allen", "John Backus")
_TAGS = ("computing", "simplicity", "history", "machines", "programs", "proof", "debugging")
_PHRASES = ("The question is not", "It is easier to", "A program is", "Every machine needs",
            "Simplicity is", "The best way to", "Nothing is as", "Most errors are")
_ENDS = ("what the machine can do.", "ask forgiveness than permission.", "a proof in disguise.",
         "a patient teacher.", "a prerequisite for reliability.", "predict the future.",
         "practical as a good theory.", "made before the first line.")

# The page as served: no quote, only the script that fetches and inserts them.
SHELL = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Quotes, page {page}</title></head>
<body>
<h1>Quotes, page {page}</h1>
<div id="quotes"><noscript>This page needs JavaScript.</noscript></div>
<p id="nav"></p>
<script>
fetch("/js/api/quotes?page={page}").then(function (reply) {{ return reply.json(); }})
  .then(function (data) {{
    var box = document.getElementById("quotes");
    data.quotes.forEach(function (q) {{
      var div = document.createElement("div");
      div.className = "quote";
      div.setAttribute("data-id", q.id);
      div.innerHTML = '<p class="text"></p><span class="author"></span>'
        + ' <time class="added"></time> <ul class="tags"></ul>';
      div.querySelector(".text").textContent = q.text;
      div.querySelector(".author").textContent = q.author;
      div.querySelector(".added").textContent = q.added;
      q.tags.forEach(function (t) {{
        var li = document.createElement("li");
        li.className = "tag";
        li.textContent = t;
        div.querySelector(".tags").appendChild(li);
      }});
      box.appendChild(div);
    }});
    if (data.next) {{
      var a = document.createElement("a");
      a.className = "next";
      a.href = data.next;
      a.textContent = "Next page";
      document.getElementById("nav").appendChild(a);
    }}
  }});
</script>
</body></html>
"""


def quote(qid: int) -> dict[str, Any]:
    rng = random.Random(f"js-quote-{qid}")
    added = date(2024, 3, 1) + timedelta(days=qid * 2)
    return {"id": qid, "text": f"{rng.choice(_PHRASES)} {rng.choice(_ENDS)}",
            "author": rng.choice(_PEOPLE), "tags": sorted(rng.sample(_TAGS, 2)),
            "added": f"{added:%d.%m.%Y}"}


def shell(page: int) -> bytes:
    return SHELL.format(page=page).encode()


def quotes_page(page: int, pages: int) -> dict[str, Any]:
    """The JSON the shell of ``page`` fetches (``pages`` pages in all)."""
    first = (page - 1) * PER_PAGE + 1
    return {"page": page, "pages": pages,
            "next": f"/js/quotes/{page + 1}" if page < pages else None,
            "quotes": [quote(i) for i in range(first, first + PER_PAGE)]}
