"""Task ids: random version-4 UUIDs as 32 hex digits."""

from __future__ import annotations

import os
import threading
import uuid


def new_task_id() -> str:
    return uuid.uuid4().hex


class _RandomPool(threading.local):
    """os.urandom bytes fetched 8 KiB at a time, per thread (one system call per 512 ids
    instead of one per id); emptied in a forked child so parent and child never share ids."""

    def __init__(self) -> None:
        self.data = b""
        self.at = 0


_POOL = _RandomPool()
_POOL_BYTES = 16 * 512


def _reset_pool() -> None:
    global _POOL
    _POOL = _RandomPool()


os.register_at_fork(after_in_child=_reset_pool)


def fast_task_id() -> str:
    """What :func:`new_task_id` returns (a random version-4 UUID as 32 hex digits), without
    building a UUID object."""
    pool = _POOL
    at = pool.at
    if at >= len(pool.data):
        pool.data, at = os.urandom(_POOL_BYTES), 0
    raw = bytearray(pool.data[at:at + 16])
    pool.at = at + 16
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


# Byte maps setting a UUID's version (4) and variant (RFC 4122) bits, for bytes.translate.
_VERSION_4 = bytes((b & 0x0F) | 0x40 for b in range(256))
_VARIANT = bytes((b & 0x3F) | 0x80 for b in range(256))


def task_ids(count: int) -> str:
    """``count`` ids as :func:`new_task_id` makes them, joined (32 hex digits each): random
    bytes from one system call and their UUID bits set by C-level translates, no Python step
    per id (seed expansion makes millions)."""
    raw = bytearray(os.urandom(16 * count))
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    return raw.hex()


__all__ = ["fast_task_id", "new_task_id", "task_ids"]
