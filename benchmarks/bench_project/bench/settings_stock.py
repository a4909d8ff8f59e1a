"""Stock Scrapy: default scheduler, start URLs from a file, items to a JSON Lines feed."""

from bench.settings import *  # noqa: F403

# FEEDS is given per run: -s FEEDS='{"/path/items.jsonl": {"format": "jsonlines"}}'
