"""Redis plumbing that knows nothing of tasks.

- :mod:`.connection`: clients from a ``METEORSEED_REDIS_URL`` (one server or a cluster), and
  their types (``SyncRedis``, ``AsyncRedis``, their pipelines) that annotations use
- :mod:`.scripts`: the Lua scripts, loaded once, called with EVALSHA
- :mod:`.replies`: a reply as text or bytes, whatever the client decodes; a stored JSON record
- :mod:`.reads`: read plans run on a synchronous or an asyncio client alike
- :mod:`.redis_full`: Redis refusing writes for want of memory, one view per worker
"""
