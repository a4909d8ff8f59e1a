"""Writing exec tasks into the task stream: fleet-wide dedup, enqueue, backlog and backpressure.

Dedup and enqueue happen in one Lua script (``lua/enqueue.lua``), so concurrent writers (several
``seed-expand`` runs, workers yielding child requests) never enqueue one URL twice. The stream is
never trimmed: an entry leaves it only when a worker has acked it (and then XDELs it), which is
also what makes :meth:`TaskWriter.backlog` cheap.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from meteorseed_scrapy import scripts
from meteorseed_scrapy.keys import KeyLayout
from meteorseed_scrapy.tasks import MESSAGE_VERSION, ExecTask, TaskError, canonical_url

if TYPE_CHECKING:
    from redis.asyncio import Redis

logger = logging.getLogger(__name__)

#: Tasks per script call. A call blocks Redis while it runs; 500 SADD+XADD take well under a
#: millisecond, so workers reading the stream never wait long behind a big seed file.
CHUNK_SIZE = 500
#: Seconds between two ``on_wait`` reports while :meth:`TaskWriter.wait_for_room` waits.
WAIT_REPORT_INTERVAL = 10.0

# enqueue.lua writes the "v" field itself (the task JSON is its only payload); a new message
# version in tasks.py must come with a script update, so fail loudly at import, not in Redis.
_SCRIPT_MESSAGE_VERSION = "1"
if MESSAGE_VERSION != _SCRIPT_MESSAGE_VERSION:  # pragma: no cover - guards a future edit
    raise RuntimeError(
        f"lua/enqueue.lua writes message version {_SCRIPT_MESSAGE_VERSION}, "
        f"tasks.py encodes version {MESSAGE_VERSION}: update the script"
    )


def fingerprint(task: ExecTask) -> str:
    """The dedup fingerprint of ``task``: hex of the first 16 bytes of a SHA-256.

    A plain GET is identified by its canonical URL alone. Any other method, or a GET that carries
    a body, also hashes the method and the body: a POST search with two different bodies is two
    different requests. Raises ``ValueError`` when the URL cannot be canonicalised.
    """
    method = task.method.upper()
    url = canonical_url(task.url)
    data = url if method == "GET" and not task.body else f"{method}\0{url}\0{task.body}"
    return hashlib.sha256(data.encode("utf-8")).digest()[:16].hex()


@dataclass(frozen=True)
class AddResult:
    """What one :meth:`TaskWriter.add` call did."""

    enqueued: int = 0
    duplicates: int = 0

    def __add__(self, other: AddResult) -> AddResult:
        return AddResult(self.enqueued + other.enqueued, self.duplicates + other.duplicates)


# One task as the script wants it: (dedup set or None, fingerprint, task JSON).
_Encoded = tuple[str | None, str, str]


class TaskWriter:
    """Adds exec tasks to ``keys.stream`` (deduplicated per site) and watches its backlog."""

    def __init__(self, redis: Redis, keys: KeyLayout) -> None:
        # No I/O here (not even reading the script file): writers are built in constructors.
        self._redis = redis
        self._keys = keys
        self._script: Any = None

    @property
    def keys(self) -> KeyLayout:
        return self._keys

    def _enqueue_script(self) -> Any:
        if self._script is None:
            self._script = scripts.register(self._redis, "enqueue")
        return self._script

    def _encode(self, task: ExecTask, dedup: bool) -> _Encoded:
        try:
            payload = task.to_message()["t"]
        except TaskError:
            raise
        except ValueError as exc:  # e.g. a lone surrogate that UTF-8 cannot encode
            raise TaskError("task", f"cannot be encoded as UTF-8 JSON ({exc})") from None
        if not dedup:
            return None, "", payload
        try:
            return self._keys.seen(task.site_id), fingerprint(task), payload
        except ValueError as exc:
            raise TaskError("url", f"cannot be canonicalised: {exc}") from None

    def _script_args(self, chunk: Sequence[_Encoded]) -> tuple[list[str], list[str | int]]:
        positions: dict[str, int] = {}  # dedup set -> 1-based position after the stream key
        args: list[str | int] = []
        for seen_key, fp, payload in chunk:
            if seen_key is None:
                args.extend((0, "", payload))
            else:
                args.extend((positions.setdefault(seen_key, len(positions) + 1), fp, payload))
        return [self._keys.stream, *positions], args

    async def add(self, tasks: Sequence[ExecTask], *, dedup: bool = True) -> AddResult:
        """Enqueue ``tasks``, skipping those whose fingerprint the site has already seen.

        Every task is encoded before anything is sent, so a task that is too large (or otherwise
        not encodable) raises :class:`TaskError` and nothing of the call is enqueued. The tasks
        go in script calls of :data:`CHUNK_SIZE`, all sent in one round trip.
        """
        encoded = [self._encode(task, dedup) for task in tasks]
        if not encoded:
            return AddResult()
        script = self._enqueue_script()
        calls = [
            self._script_args(encoded[i : i + CHUNK_SIZE])
            for i in range(0, len(encoded), CHUNK_SIZE)
        ]
        if len(calls) == 1:
            keys, args = calls[0]
            replies = [await script(keys=keys, args=args)]
        else:
            async with self._redis.pipeline(transaction=False) as pipe:
                for keys, args in calls:
                    await script(keys=keys, args=args, client=pipe)
                replies = await pipe.execute()
        result = AddResult()
        for enqueued, duplicates in replies:
            result += AddResult(int(enqueued), int(duplicates))
        logger.debug(
            "enqueued %d tasks, %d duplicates, into %s", result.enqueued, result.duplicates,
            self._keys.stream,
        )
        return result

    async def release(self, task: ExecTask) -> None:
        """Forget ``task``'s fingerprint, so a later seed may enqueue its URL again.

        Called when a task is dead-lettered: a URL that failed for good must stay retryable.
        """
        await self._redis.srem(self._keys.seen(task.site_id), fingerprint(task))

    async def backlog(self) -> int:
        """Tasks in the stream that no worker has received yet.

        Workers XDEL an entry right after XACKing it, so XLEN counts waiting plus pending
        entries, and XPENDING's summary gives the pending ones. This works on Redis 6.2, whose
        XINFO GROUPS has no ``lag``. Both are read in one MULTI so the two numbers agree.
        """
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xlen(self._keys.stream)
            pipe.xpending(self._keys.stream, self._keys.group)
            length, pending = await pipe.execute(raise_on_error=False)
        if isinstance(length, Exception):
            raise length
        if isinstance(pending, ResponseError) and str(pending).startswith("NOGROUP"):
            # No consumer group yet (no worker ever started): every entry is waiting.
            pending_count = 0
        elif isinstance(pending, Exception):
            raise pending
        else:
            pending_count = int(pending["pending"])
        return max(0, int(length) - pending_count)

    async def wait_for_room(
        self, max_backlog: int, on_wait: Callable[[int], None], poll: float = 1.0
    ) -> None:
        """Return once the backlog is at most ``max_backlog``; until then sleep ``poll`` seconds
        between checks and call ``on_wait(backlog)`` every :data:`WAIT_REPORT_INTERVAL` seconds.

        Backpressure only: nothing is ever trimmed to make room.
        """
        if max_backlog < 0:
            raise ValueError(f"max_backlog must be >= 0, got {max_backlog}")
        last_report: float | None = None
        while True:
            backlog = await self.backlog()
            if backlog <= max_backlog:
                return
            now = time.monotonic()
            if last_report is None or now - last_report >= WAIT_REPORT_INTERVAL:
                last_report = now
                logger.info("backlog %d > %d: waiting for workers", backlog, max_backlog)
                on_wait(backlog)
            await asyncio.sleep(poll)
