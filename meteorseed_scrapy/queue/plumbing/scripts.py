"""Lua scripts shipped as ``lua/*.lua`` files (each documents its KEYS, ARGV and return value).

Each file is read once per process; redis-py's ``Script`` sends EVALSHA and falls back to
SCRIPT LOAD on NOSCRIPT, so a Redis restart costs one extra round trip, not an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from redis.client import NEVER_DECODE
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from meteorseed_scrapy.queue.plumbing.connection import (
        AnyRedis,
        AsyncPipeline,
        AsyncRedis,
        SyncPipeline,
        SyncRedis,
    )

#: A registered script of either kind (its ``sha`` and ``script`` are what a caller reads).
AnyScript = Script | AsyncScript
P = TypeVar("P", bound="SyncPipeline | AsyncPipeline", covariant=True)

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


@overload
def register(redis: SyncRedis, name: str) -> Script: ...
@overload
def register(redis: AsyncRedis, name: str) -> AsyncScript: ...
@overload
def register(redis: AnyRedis, name: str) -> AnyScript: ...
def register(redis: AnyRedis, name: str) -> AnyScript:
    """A callable ``script(keys=[...], args=[...])`` bound to ``redis`` (sync or asyncio client)."""
    return redis.register_script(script_source(name))


async def call_as_bytes(redis: AsyncRedis, script: AsyncScript, keys: Sequence[Any],
                        args: Sequence[Any]) -> Any:
    """Run ``script`` (a registered one) on an asyncio client with its reply left as bytes,
    whatever the client decodes (a value that is not UTF-8 would fail the whole reply)."""
    command = ("EVALSHA", script.sha, len(keys), *keys, *args)
    try:
        return await redis.execute_command(*command, **{NEVER_DECODE: []})
    except NoScriptError:  # a restarted Redis: load it once, as Script.__call__ does
        script.sha = await redis.script_load(script.script)
        return await redis.execute_command("EVALSHA", script.sha, *command[2:],
                                           **{NEVER_DECODE: []})


class ScriptPipeline(Generic[P]):
    """Script calls (and any other commands) in one redis-py pipeline, sent in one round trip.

    redis-py's own way, ``script(keys, args, client=pipe)``, makes ``execute()`` ask SCRIPT
    EXISTS first: a second round trip before every pipeline, which on a busy worker's event
    loop doubled the response-to-ack time of every task. Here a call is a bare EVALSHA; a
    script the server lacks (NOSCRIPT: after a restart or SCRIPT FLUSH) is loaded by calling it
    again on its own, after the pipeline, so the calls still run in order.
    """

    def __init__(self, pipe: P) -> None:
        self.pipe = pipe
        self._calls: dict[int, tuple[AnyScript, Sequence[Any], Sequence[Any]]] = {}

    def call(self, script: AnyScript, keys: Sequence[Any], args: Sequence[Any]) -> None:
        self._calls[len(self.pipe)] = (script, keys, args)
        self.pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def _rerun(self, replies: list[Any]
               ) -> list[tuple[int, tuple[AnyScript, Sequence[Any], Sequence[Any]]]]:
        """The script calls to run again (NOSCRIPT); raises the first other error, as
        ``execute()`` does."""
        again = []
        for i, reply in enumerate(replies):
            if isinstance(reply, NoScriptError) and i in self._calls:
                again.append((i, self._calls[i]))
            elif isinstance(reply, Exception):
                raise reply
        return again

    async def execute(self: ScriptPipeline[AsyncPipeline]) -> list[Any]:
        """The replies, in order (an asyncio pipeline)."""
        replies = list(await self.pipe.execute(raise_on_error=False))
        for i, (script, keys, args) in self._rerun(replies):
            replies[i] = await script(keys=keys, args=args)
        return replies

    def execute_sync(self: ScriptPipeline[SyncPipeline]) -> list[Any]:
        """:meth:`execute` of a blocking pipeline."""
        replies = list(self.pipe.execute(raise_on_error=False))
        for i, (script, keys, args) in self._rerun(replies):
            replies[i] = script(keys=keys, args=args)
        return replies


class Scripts:
    """The scripts of one client, each registered at its first use: an object that holds a
    client can build this in its constructor without reading any file."""

    def __init__(self, redis: AsyncRedis) -> None:
        self._redis = redis
        self._registered: dict[str, AsyncScript] = {}

    def __getitem__(self, name: str) -> AsyncScript:
        script = self._registered.get(name)
        if script is None:
            script = self._registered[name] = register(self._redis, name)
        return script
