"""Run the API in a background thread with its own event loop (tests, embedding in a tool).

``with ServerThread(config) as server: urlopen(server.url + "/seeds")`` — a real server on a
free loopback port; leaving the block shuts it down as ``meteorseed serve`` does on SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from types import TracebackType

from meteorseed_scrapy.api import guard
from meteorseed_scrapy.api.app import create_app
from meteorseed_scrapy.api.config import ApiConfig

#: Seconds :meth:`ServerThread.stop` waits for the server to shut down.
STOP_TIMEOUT = 30.0


class ServerThread:
    def __init__(self, config: ApiConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.host = host
        self.port = port
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="meteorseed-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError(f"the API server did not start: {self._error}") from self._error
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """Shut the server down as SIGTERM does; a shutdown that hangs is an error showing
        where every thread is (the server's, and the threads its loop waits for)."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(STOP_TIMEOUT)
        if self._thread.is_alive():
            raise TimeoutError(f"the API server did not stop within {STOP_TIMEOUT:g} s;"
                               f" its threads are at:\n{thread_stacks()}")

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by __enter__
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        runner = guard.runner(create_app(self.config))
        await runner.setup()
        try:
            site = guard.site(runner, self.host, self.port)
            await site.start()
            self.port = site.port
            self._ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()


def thread_stacks() -> str:
    """Every live thread's name and stack, most recent call last."""
    frames = sys._current_frames()
    return "\n".join(
        f"--- {thread.name}\n" + "".join(traceback.format_stack(frames[thread.ident]))
        for thread in threading.enumerate()
        if thread.ident in frames)
