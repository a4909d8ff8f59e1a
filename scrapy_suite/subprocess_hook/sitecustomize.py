"""Imported by every Python started with this directory on ``PYTHONPATH``, which
``scrapy_suite.plugin`` puts there: the crawlers of Scrapy's command-line tests, run in
subprocesses, get the add-on as the pytest process's do (``scrapy_suite.injection``)."""

from scrapy_suite.injection import patch_from_environment

patch_from_environment()
