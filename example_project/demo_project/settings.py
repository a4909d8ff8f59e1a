"""Settings of the demo project: a plain Scrapy project with the MeteorSeed add-on enabled.

Redis, the namespace, the store and the worker's name come from the command line (``-s``) or
the environment (``REDIS_URL``, ``MONGO_URL``); see the README's settings table.
"""

BOT_NAME = "demo_project"

# "demo" (a hand-written spider) and "sites" (the generic rule spider of meteorseed_scrapy).
SPIDER_MODULES = ["demo_project.spiders", "meteorseed_scrapy.sites.spider"]
NEWSPIDER_MODULE = "demo_project.spiders"

# The one line that turns this project into a MeteorSeed worker: stream scheduler, upsert
# pipeline and the politeness middlewares.
ADDONS = {"meteorseed_scrapy.addon.MeteorSeedAddon": 0}

LOG_LEVEL = "INFO"
CONCURRENT_REQUESTS = 16

# The demo site runs on this machine: no robots.txt, and per-site limits well above the polite
# defaults (2 requests/s, 4 in flight per site), which are meant for other people's servers.
ROBOTSTXT_OBEY = False
METEORSEED_SITE_RATE = 50.0
METEORSEED_SITE_BURST = 20
METEORSEED_SITE_CONCURRENCY = 8

# One rule file per site for `scrapy crawl sites`; edits apply to running workers within ~1 s.
# Package data (demo_project/sites, see setup.py): found in this checkout and inside the egg that
# scrapyd-deploy builds alike (a path inside an egg is not a directory).
METEORSEED_SITES_DIR = "pkg://demo_project/sites"

TELNETCONSOLE_ENABLED = False
FEED_EXPORT_ENCODING = "utf-8"
