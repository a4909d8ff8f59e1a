"""scrapy-redis 0.9.1 as its README sets it up for a distributed crawl."""

from vs.settings import *  # noqa: F403

SCHEDULER = "scrapy_redis.scheduler.Scheduler"
DUPEFILTER_CLASS = "scrapy_redis.dupefilter.RFPDupeFilter"
# Several workers share one crawl: keep the queue and fingerprints when one stops.
SCHEDULER_PERSIST = True
ITEM_PIPELINES = {"scrapy_redis.pipelines.RedisPipeline": 300}
