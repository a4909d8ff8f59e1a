"""MeteorSeed for Scrapy: reliable, polite, distributed crawl workers on Redis Streams."""

__version__ = "0.1.0"
