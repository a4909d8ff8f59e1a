"""Redis memory of the URL dedup layer per URL, duplicates enqueued, unique URLs wrongly skipped.

    python benchmarks/dedup_memory.py [--urls 1000000 10000000] [--dup-ratio 0.1]

For each size N, on a fresh throwaway redis-server (default config): N unique URLs of one
site are enqueued through ``enqueue.lua`` (the real script: dedup layer + XADD) with
tiny task payloads and a 30-day re-crawl window, then N * dup-ratio of them again. Counted:
unique URLs the dedup layer wrongly called duplicates (a 48-bit fingerprint collision;
expected ~N^2/2^49) and duplicates that got through (must be 0). Then the stream is deleted
and the memory of what is
left (only the dedup keys) is compared with an empty server: INFO used_memory, not MEMORY
USAGE (see SCRAPY_NOTES "Redis versions"). The Python side (task building, canonicalisation)
is not part of this figure; benchmarks/seed_expand_rate.py measures that.
The last line is the figure: the worst bytes per URL over the sizes.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from meteorseed_scrapy.queue.enqueue.enqueue_calls import pack_tasks
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing import scripts
from meteorseed_scrapy.testing.redis_server import RedisServer

BATCH = 500
#: A 30-day re-crawl window: the site then has time slots in its entries and expiring keys.
WINDOW = "2592000"


def fp(i: int) -> bytes:
    url = f"https://news.example.com/article/{i}?ref=list"
    return hashlib.sha256(url.encode()).digest()[:16]


def run(n: int, dup_ratio: float) -> tuple[float, int, int, dict[str, str]]:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        keys = KeyLayout("bench")
        script = client.register_script(scripts.script_source("enqueue"))
        client.config_set("appendonly", "no")
        base = int(client.info("memory")["used_memory"])

        def send(ids: range | list[int]) -> int:
            enqueued = 0
            pipe = client.pipeline(transaction=False)
            for start in range(0, len(ids), BATCH):
                batch = pack_tasks((1, fp(i), WINDOW, "t") for i in ids[start : start + BATCH])
                script(keys=[keys.stream, keys.seen("site")], args=["", *batch], client=pipe)
                if len(pipe) >= 20:
                    enqueued += sum(int(r[0]) for r in pipe.execute())
            enqueued += sum(int(r[0]) for r in pipe.execute())
            return enqueued

        t0 = time.perf_counter()
        unique_enqueued = send(range(n))
        elapsed = time.perf_counter() - t0
        dups = list(range(0, n, max(1, round(1 / dup_ratio))))
        dup_enqueued = send(dups)
        client.delete(keys.stream)
        time.sleep(0.2)  # let lazy frees settle
        used = int(client.info("memory")["used_memory"]) - base
        info = {
            "keys": str(client.dbsize()),
            "bucket encodings": str(sorted({
                str(client.object("encoding", k)) for k in client.scan_iter(
                    f"{keys.seen('site')}:{WINDOW}:*[0-9]", count=1000)
            })),
            "unique URLs/s through enqueue.lua": f"{n / elapsed:,.0f}",
        }
        client.close()
        return used / n, n - unique_enqueued, dup_enqueued, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--urls", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--dup-ratio", type=float, default=0.1)
    opts = parser.parse_args()
    worst = 0.0
    for n in opts.urls:
        per_url, skipped, dup_enqueued, info = run(n, opts.dup_ratio)
        worst = max(worst, per_url)
        print(f"N={n:,}: {per_url:.2f} B/URL of used_memory; unique URLs wrongly skipped: "
              f"{skipped}; duplicates enqueued: {dup_enqueued} (of {int(n * opts.dup_ratio):,} "
              f"re-sent); {info}", flush=True)
    print(f"dedup layer: {worst:.2f} bytes of Redis memory per URL (worst of "
          f"{', '.join(f'{n:,}' for n in opts.urls)} URLs; goal <= 16)")


if __name__ == "__main__":
    main()
