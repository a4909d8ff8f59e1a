"""What a namespace's workers share about each other and their tasks.

- :mod:`.liveness`: which workers are alive (``<ns>:workers``)
- :mod:`.spiders`: which spiders have task sets, and which spider each worker runs
- :mod:`.delayed`: the delayed set's entries (site, reason, due time)
- :mod:`.snapshot`: the status snapshot's shape and JSON
- :mod:`.crawl_progress`: each seed's counters, kept by the scripts as its tasks are written
  and settle, and its end
- :mod:`.events`: the crawl events stream (``<ns>:events``), its one writer and reader
"""
