"""Lua scripts shipped as ``lua/*.lua`` files (each documents its KEYS, ARGV and return value).

Each file is read once per process; redis-py's ``Script`` sends EVALSHA and falls back to
SCRIPT LOAD on NOSCRIPT, so a Redis restart costs one extra round trip, not an error.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any


@cache
def script_source(name: str) -> str:
    lua = resources.files("meteorseed_scrapy").joinpath("lua")
    return lua.joinpath(f"{name}.lua").read_text("utf-8")


def register(redis: Any, name: str) -> Any:
    """A callable ``script(keys=[...], args=[...])`` bound to ``redis`` (sync or asyncio client)."""
    return redis.register_script(script_source(name))
