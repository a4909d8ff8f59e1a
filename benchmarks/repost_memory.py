"""Redis memory per content fingerprint: per site (``<ns>:{<site>}:fp:<sha1>``) and
namespace-wide (``<ns>:fp:<sha1>``, ``METEORSEED_REPOSTS_ACROSS_SITES``).

A fresh Redis; N fingerprints claimed through :class:`RepostIndex` exactly as the sites
pipeline claims them (SET NX EX, the value a document id ``<site>:<article id>``), spread over
ten sites; ``used_memory`` before and after, divided by N. The keys expire with the claiming
site's dedup window: that TTL is the bound (N = articles published per window).

Run: ``.venv/bin/python benchmarks/repost_memory.py [--items 200000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from meteorseed_scrapy.queue.keys import KeyLayout  # noqa: E402
from meteorseed_scrapy.queue.plumbing.connection import async_client  # noqa: E402
from meteorseed_scrapy.sites.reposts import RepostIndex  # noqa: E402
from meteorseed_scrapy.testing.redis_server import RedisServer  # noqa: E402

WINDOW = 30 * 86400


async def measure(url: str, items: int, across_sites: bool) -> float:
    client = async_client(url, decode_responses=True)
    await client.flushall()
    before = int((await client.info("memory"))["used_memory"])
    index = RepostIndex(client, KeyLayout("meteorseed"), across_sites)
    batch = 50  # (the client's pool caps its connections)
    for start in range(0, items, batch):
        await asyncio.gather(*(
            index.owner(f"site{n % 10}", hashlib.sha1(str(n).encode()).hexdigest(),
                        f"site{n % 10}:{100000 + n}", WINDOW)
            for n in range(start, min(items, start + batch))))
    after = int((await client.info("memory"))["used_memory"])
    assert await client.dbsize() == items
    await client.aclose()
    return (after - before) / items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200_000)
    items = parser.parse_args().items
    with RedisServer() as redis:
        per_site = asyncio.run(measure(redis.url, items, False))
        across = asyncio.run(measure(redis.url, items, True))
    print(f"per site: {per_site:.0f} bytes per fingerprint ({items} items)")
    print(f"across sites: {across:.0f} bytes per fingerprint ({items} items);"
          f" 1 million articles per window = {across * 1e6 / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
