"""The task queue on Redis: writing tasks, reading, acking, dead letters, and reading it all back.

Sub-packages by job, each importing only those below it (import-linter's ``queue layers``
contract in pyproject.toml):

- :mod:`.inspect`: reading a namespace back (``meteorseed status``, ``meteorseed task``, the API)
- :mod:`.consume`: the worker's side (read, reclaim, ack, dead-letter, the consumer group,
  per-task records, retention)
- :mod:`.enqueue`: writing tasks (dedup, the enqueue script's calls, pipelining, backpressure)
- :mod:`.fleet`: what the fleet shares (which workers are alive, which spiders have task sets,
  the delayed set's entries, the status snapshot's shape)
- :mod:`.shards` and :mod:`.scan`: keys spread over shards or a cluster, and walking a
  namespace's keys
- :mod:`.keys`: the whole Redis key layout, in one place
- :mod:`.plumbing`: clients, Lua scripts, replies as text, read plans

The Lua scripts themselves are ``meteorseed_scrapy/lua/*.lua``. See docs/architecture.md.
"""
