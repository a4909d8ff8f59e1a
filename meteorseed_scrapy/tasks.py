"""Seed tasks and exec tasks: small validated value objects and their JSON message format.

An exec task travels through a Redis Stream as two fields: ``v`` (the format version) and
``t`` (the task as compact JSON). Never pickle: a message must be readable by any worker,
any version, any language, and must not be able to run code.

The pieces live in :mod:`.validation` (:class:`TaskError`, field checks), :mod:`.canonical`,
:mod:`.task_ids`, :mod:`.exec_task` and :mod:`.seed_task`; this module gathers their names.
"""

from meteorseed_scrapy.canonical import _is_canonical, canonical_url, url_fingerprint
from meteorseed_scrapy.exec_task import MAX_MESSAGE_BYTES, MESSAGE_VERSION, ExecTask
from meteorseed_scrapy.seed_task import TASK_TYPES, SeedTask
from meteorseed_scrapy.task_ids import fast_task_id as _fast_task_id
from meteorseed_scrapy.task_ids import new_task_id
from meteorseed_scrapy.validation import TaskError, check_url
from meteorseed_scrapy.validation import check_id as _check_id
from meteorseed_scrapy.validation import check_json_safe as _check_json_safe
from meteorseed_scrapy.validation import check_lane as _check_lane

__all__ = ["MAX_MESSAGE_BYTES", "MESSAGE_VERSION", "TASK_TYPES", "ExecTask", "SeedTask",
           "TaskError", "_check_id", "_check_json_safe", "_check_lane", "_fast_task_id",
           "_is_canonical", "canonical_url", "check_url", "new_task_id", "url_fingerprint"]
