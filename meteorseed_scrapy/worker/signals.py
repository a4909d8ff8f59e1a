"""Signals a MeteorSeed worker sends through ``crawler.signals`` (Scrapy's signal manager).

Connect a handler as with Scrapy's own signals::

    crawler.signals.connect(handler, signal=task_settled)

Handlers run on the reactor thread and should be quick; their errors are logged and ignored.
"""

#: A task this worker held is settled: it will be acked, dead-lettered, deferred or (failed)
#: left for redelivery. Arguments: ``task`` (ExecTask), ``outcome``
#: (:class:`~meteorseed_scrapy.worker.fate.Outcome`), ``reason`` (str, "" when done).
task_settled = object()

#: A site's circuit breaker changed state as this worker saw it. Arguments: ``site`` (str),
#: ``state`` (a :class:`~meteorseed_scrapy.politeness.breaker.BreakerState`, a ``str``:
#: "closed", "open", or "ramp" while it recovers).
breaker_state_changed = object()
