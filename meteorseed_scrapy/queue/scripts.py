"""Lua scripts shipped as ``lua/*.lua`` files (each documents its KEYS, ARGV and return value).

Each file is read once per process; redis-py's ``Script`` sends EVALSHA and falls back to
SCRIPT LOAD on NOSCRIPT, so a Redis restart costs one extra round trip, not an error.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

_INCLUDE = "--#include "


@cache
def script_source(name: str) -> str:
    """The script's text; a line ``--#include other`` is replaced by ``lua/other.lua`` (Redis
    has no modules, so shared Lua functions are pasted into each script that uses them)."""
    lua = resources.files("meteorseed_scrapy").joinpath("lua")
    lines = lua.joinpath(f"{name}.lua").read_text("utf-8").splitlines(keepends=True)
    return "".join(
        script_source(line[len(_INCLUDE):].strip()) if line.startswith(_INCLUDE) else line
        for line in lines
    )


def register(redis: Any, name: str) -> Any:
    """A callable ``script(keys=[...], args=[...])`` bound to ``redis`` (sync or asyncio client)."""
    return redis.register_script(script_source(name))


class Scripts:
    """The scripts of one client, each registered at its first use: an object that holds a
    client can build this in its constructor without reading any file."""

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._registered: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        script = self._registered.get(name)
        if script is None:
            script = self._registered[name] = register(self._redis, name)
        return script
