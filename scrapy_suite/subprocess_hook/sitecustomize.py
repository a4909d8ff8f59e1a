"""Imported by every Python started with this directory on ``PYTHONPATH``, which
``scrapy_suite.plugin`` puts there: the crawlers of Scrapy's command-line tests, run in
subprocesses, get the add-on as the pytest process's do (``scrapy_suite.injection``)."""

import os
from pathlib import Path

if os.environ.get("SCRAPY_SUITE_REDIS_URL") and os.environ.get("SCRAPY_SUITE_WORKDIR"):
    from scrapy_suite.injection import patch_crawlers

    patch_crawlers(os.environ["SCRAPY_SUITE_REDIS_URL"], Path(os.environ["SCRAPY_SUITE_WORKDIR"]))
