"""A worker crawl: Scrapy's engine fed from the task streams, a task acked once settled.

- :mod:`.crawl`: the assembly, in one place (the crawl's runtime to the pump)
- :mod:`.pump`: a worker's tasks from delivery to ack, the one owner of their state
- :mod:`.intake`, :mod:`.work_budget`, :mod:`.waiting`, :mod:`.dispatcher`: tasks read by free
  capacity, held per site and served by priority (with this worker's own new tasks on their
  way through the stream), handed out to the downloader by permit
- :mod:`.seed_holds`: an operator's hold (tasks parked) or cancel (settled unfetched) of a seed
- :mod:`.start_pacing`: start requests paced as Scrapy paces them
- :mod:`.requests`: ExecTask <-> ``scrapy.Request``, without pickle
- :mod:`.scrapes`: which task Scrapy's scraper works for
- :mod:`.children_cap`, :mod:`.yielded`, :mod:`.duplicates`, :mod:`.children`: requests a
  callback yields (as many as the cap allows) become child tasks (``DUPEFILTER_CLASS``
  honoured), written before their parent may be acked
- :mod:`.fate`, :mod:`.ledger`, :mod:`.settling`, :mod:`.completions`: how a task can end and
  the one decision of its fate, the book that only counts, acting on the fate, and the flush
  that writes it to Redis
- :mod:`.loops`, :mod:`.stall`, :mod:`.keepalive`, :mod:`.redis_watch`,
  :mod:`.redis_watchdog`: background loops, a blocked reactor told from an outage, the
  keep-alive thread, a Redis that can lose keys, how long to wait for an unreachable Redis
- :mod:`.breaker_states`, :mod:`.signals`, :mod:`.interpreter`, :mod:`.shutdown`: breaker
  changes announced, the worker's signals, interpreter tweaks while busy, the last writes on stop

See docs/architecture.md (the life of a task).
"""
