"""Writing tasks into the task streams.

- :mod:`.writer`: :class:`~meteorseed_scrapy.queue.enqueue.writer.TaskWriter`, fleet-wide dedup
  and enqueue
- :mod:`.enqueue_calls`: ``lua/enqueue.lua``'s calls packed and their replies read
- :mod:`.batch_pipeline`: ordered pipelining of a caller's batches
- :mod:`.dedup`: what identifies a request, its re-crawl window, and the server setting the
  dedup layer depends on
- :mod:`.backlog`: how many tasks wait, and backpressure
"""
