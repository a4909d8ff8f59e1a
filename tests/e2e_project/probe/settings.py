BOT_NAME = "probe"
SPIDER_MODULES = ["probe.spiders"]
ADDONS = {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}
EXTENSIONS = {"probe.stats_file.StatsFile": 0, "probe.settle_watch.SettleWatch": 0,
              "probe.scrape_fault.ScrapeFault": 0}
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
CONCURRENT_REQUESTS = 8
RETRY_TIMES = 1
DOWNLOAD_TIMEOUT = 20
# The local test site is not a site to be polite to; politeness tests set their own limits.
METEORSEED_SITE_RATE = 1000
METEORSEED_SITE_BURST = 1000
METEORSEED_SITE_CONCURRENCY = 100
METEORSEED_BACKOFF_BASE = 0.2
