"""Coming from scrapy-redis: its connection settings, and its waiting requests and start URLs
moved into MeteorSeed's task stream (``scrapy seed-expand --from-scrapy-redis SPIDER``)."""
