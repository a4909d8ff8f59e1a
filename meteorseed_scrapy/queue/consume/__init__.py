"""The worker's side of the task streams.

- :mod:`.consumer`: read, reclaim, keep alive, ack, dead-letter, hand back
  (:class:`~meteorseed_scrapy.queue.consume.consumer.StreamConsumer`)
- :mod:`.acks`: its acks (with completion records and items feed entries) and dead letters;
  the completion records and failure notes read back beside the streams
- :mod:`.group`: the consumer group as a whole: creation, membership, the idle check
- :mod:`.delivery`: one delivery and the consumer's bookkeeping
- :mod:`.lanes`: how free capacity is shared between lanes
- :mod:`.delayed_set`: tasks parked until due (retries' backoff, quotas, paused sites), owned
  here and changed only through its verbs
- :mod:`.seed_control`: an operator's hold, resume or cancel of a seed, fleet-wide
- :mod:`.task_history`: what became of each task, kept per site for a retention
- :mod:`.items_feed`: committed items handed on to other programs (``<ns>:items``)
- :mod:`.deadletters`: the dead-letter stream: read, requeue, purge
- :mod:`.retention`: how long dead letters and departed consumers are kept
"""
