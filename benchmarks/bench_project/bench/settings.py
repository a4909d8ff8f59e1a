"""Settings shared by every contender (stock Scrapy, MeteorSeed, scrapy-redis).

Each contender has its own module that star-imports this one; the harness picks it with the
``SCRAPY_SETTINGS_MODULE`` environment variable and passes per-run values with ``-s``.
"""

BOT_NAME = "bench"
SPIDER_MODULES = ["bench.spiders"]
EXTENSIONS = {"bench.timing.Timing": 0}
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
CONCURRENT_REQUESTS = 16
# The per-slot default (8) would otherwise be the real bound: every contender gets 16.
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
RETRY_TIMES = 1
DOWNLOAD_TIMEOUT = 30
COOKIES_ENABLED = False
