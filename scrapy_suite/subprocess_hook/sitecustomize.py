"""Imported by every Python started with this directory on ``PYTHONPATH``, which
``scrapy_suite.run`` and ``scrapy_suite.plugin`` put there: no name lookup leaves the machine
(``meteorseed_scrapy.testing.loopback_dns``; Scrapy's ``tests`` package looks up a host meant not
to exist as it is imported), and the crawlers of Scrapy's command-line tests, run in subprocesses,
get the add-on as the pytest process's do (``scrapy_suite.injection``)."""

from meteorseed_scrapy.testing.loopback_dns import resolve_loopback_only
from scrapy_suite.injection import patch_from_environment

resolve_loopback_only()
patch_from_environment()
