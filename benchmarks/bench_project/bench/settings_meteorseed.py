"""MeteorSeed's default set-up: the add-on (StreamScheduler, ack after commit, UpsertPipeline).

The fleet-wide politeness limits (defaults: 2 requests/s, burst 5, 4 in flight per site) are
lifted so that, as for stock Scrapy, the only bound is 16 requests in flight: the benchmarks
measure the machinery, not the politeness policy.
"""

from bench.settings import *  # noqa: F403

ADDONS = {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}
METEORSEED_SITE_RATE = 1_000_000
METEORSEED_SITE_BURST = 1_000_000
METEORSEED_SITE_CONCURRENCY = CONCURRENT_REQUESTS  # noqa: F405
# Inactive unless BENCH_STAGES_FILE is set (throughput.py --stages).
EXTENSIONS = {**EXTENSIONS, "bench.ack_stages.AckStages": 0}  # noqa: F405
