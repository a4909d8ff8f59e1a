"""Scrapy commands added by meteorseed_scrapy (registered via the scrapy.commands entry point)."""
