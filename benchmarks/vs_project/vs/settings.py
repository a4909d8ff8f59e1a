"""Shared by both contenders of ``benchmarks/vs_scrapy_redis.py``; each adds its own lines."""

BOT_NAME = "vs"
SPIDER_MODULES = ["vs.spiders"]
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
CONCURRENT_REQUESTS = 16
CONCURRENT_REQUESTS_PER_DOMAIN = 16
DOWNLOAD_DELAY = 0
RETRY_TIMES = 1
COOKIES_ENABLED = False
