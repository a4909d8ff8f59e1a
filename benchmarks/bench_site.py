"""A tiny, fast, deterministic HTTP/1.1 site for the benchmarks, on loopback, in its own process.

``python benchmarks/bench_site.py [--port 0]`` prints ``http://127.0.0.1:<port>`` on its first
line of stdout, then serves until SIGTERM/SIGINT:

* ``GET /item/<n>``: a ~5 KB article page (title, author, date, paragraphs, links), the same
  bytes for the same ``n`` on every run; ``?delay=<ms>`` answers after that many milliseconds.
* ``GET /hits``: JSON ``{"total": N, "paths": {"/item/3": 1, ...}}`` (requests per path).

Keep-alive, one asyncio loop, pages built from a few cached templates: the site costs far less
CPU than the crawler it feeds, and it is the same site for every contender of a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
from collections import Counter
from datetime import date, timedelta

# The demo site's words: the same seeded text, built by the same code.
from meteorseed_scrapy.testing.demo_pages import FIRST, LAST, sentence

VARIANTS = 64
MAX_DELAY_MS = 60_000


def _template(variant: int) -> str:
    """An article page with ``{n}`` placeholders; ~5 KB once filled in."""
    rng = random.Random(f"bench-article-{variant}")
    title = sentence(rng, 4, 8)
    author = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    day = date(2024, 1, 1) + timedelta(days=variant)
    paragraphs = "\n".join(
        "<p>" + ". ".join(sentence(rng, 8, 14) for _ in range(5)) + ".</p>" for _ in range(10)
    )
    related = "\n".join(
        f'<li><a href="/item/{{n}}/related/{i}">Related story {i}</a></li>' for i in range(8)
    )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{title} #{{n}}</title></head>\n<body>\n"
        f'<article id="article-{{n}}">\n<h1 class="title">{title} #{{n}}</h1>\n'
        f'<p class="byline">By <span class="author">{author}</span>, '
        f'<time class="date" datetime="{day.isoformat()}">{day:%B %d, %Y}</time></p>\n'
        f'<div class="body">\n{paragraphs}\n</div>\n'
        f'<ul class="related">\n{related}\n</ul>\n</article>\n'
        '<p><a href="/">Home</a></p>\n</body></html>\n'
    )


TEMPLATES = [_template(v) for v in range(VARIANTS)]


def page(n: int) -> bytes:
    return TEMPLATES[n % VARIANTS].replace("{n}", str(n)).encode("utf-8")


class Site:
    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()

    def reply(self, target: str) -> tuple[int, str, bytes, float]:
        """(status, content type, body, delay in seconds) for ``GET target``."""
        path, _, query = target.partition("?")
        if path == "/hits":
            body = json.dumps({"total": sum(self.hits.values()), "paths": self.hits})
            return 200, "application/json", body.encode(), 0.0
        self.hits[path] += 1
        delay = 0.0
        for part in query.split("&"):
            name, _, value = part.partition("=")
            if name == "delay" and value.isdigit():
                delay = min(int(value), MAX_DELAY_MS) / 1000
        parts = path.split("/")
        if len(parts) == 3 and parts[1] == "item" and parts[2].isdigit():
            return 200, "text/html; charset=utf-8", page(int(parts[2])), delay
        return 404, "text/plain", b"not found\n", delay

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _version = ([*lines[0].split(" "), "", "", ""])[:3]
                close = any(
                    line.lower().startswith("connection:") and "close" in line.lower()
                    for line in lines[1:]
                )
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1].strip() or 0)
                if length:
                    await reader.readexactly(length)
                status, ctype, body, delay = self.reply(target)
                if delay:
                    await asyncio.sleep(delay)
                reason = "OK" if status == 200 else "Not Found"
                header = (
                    f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
                )
                writer.write(header.encode("latin-1") + (b"" if method == "HEAD" else body))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def serve(host: str, port: int) -> None:
    site = Site()
    server = await asyncio.start_server(site.handle, host, port, backlog=512)
    bound = server.sockets[0].getsockname()[1]
    print(f"http://{host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    asyncio.run(serve("127.0.0.1", args.port))
    sys.exit(0)


if __name__ == "__main__":
    main()
