"""Scrapy's own crawling tests, run on stock Scrapy and with the MeteorSeed add-on switched on.

``make test-scrapy-suite`` (docs/scrapy-suite.md); ``plugin`` is the pytest plugin that switches
the add-on on, ``run`` the two runs and their comparison.
"""
