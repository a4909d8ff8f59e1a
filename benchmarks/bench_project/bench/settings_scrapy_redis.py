"""scrapy-redis 0.9.1, the peer reference: its scheduler and dupefilter, a RedisSpider."""

from bench.settings import *  # noqa: F403

SCHEDULER = "scrapy_redis.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
# REDIS_URL, FEEDS, MAX_IDLE_TIME_BEFORE_CLOSE and CLOSESPIDER_ITEMCOUNT are given per run.
