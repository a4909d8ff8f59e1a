"""What ``meteorseed serve`` runs with: one small validated value object."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from meteorseed_scrapy.observability.notify import NotifyConfig
from meteorseed_scrapy.queue.enqueue.dedup import Fingerprinter
from meteorseed_scrapy.queue.keys import KeyLayout
from meteorseed_scrapy.queue.plumbing.connection import is_cluster_url
from meteorseed_scrapy.seeding.seed_lines import MAX_LINE_BYTES
from meteorseed_scrapy.settings import DEFAULTS


@dataclass(frozen=True)
class ApiConfig:
    redis_url: str
    namespace: str = DEFAULTS["METEORSEED_NAMESPACE"]
    #: The bearer token; None only with ``--insecure-no-auth``.
    token: str | None = None
    #: Site rule files (``METEORSEED_SITES_DIR``): allowed domains of each site.
    sites_dir: str | None = None
    #: Store of items and anomalies (``METEORSEED_STORE_URI``), for the console's sites page.
    store_uri: str | None = None
    #: Largest request body, bytes: a seed line's limit.
    max_body: int = MAX_LINE_BYTES
    #: Tasks waiting in the stream above which a dispatch waits for workers (backpressure).
    max_backlog: int = DEFAULTS["METEORSEED_MAX_BACKLOG"]
    #: Seconds to wait for Redis to accept a connection before a request gets a 503.
    redis_timeout: float = 3.0
    #: ``METEORSEED_FETCH_PRIVATE_ADDRESSES``: sitemap fetches may reach private addresses.
    fetch_private_addresses: bool = False
    #: Background expansions (sitemaps, templates, keywords) running at once; a dispatch that
    #: would start more is answered 503 with Retry-After.
    max_expansions: int = 16
    #: Connections open at once; beyond, the oldest one waiting for a request is closed (or,
    #: all busy, the new one is answered 503): meteorseed_scrapy.api.guard.
    max_connections: int = 256
    #: Seconds a connection may wait for a complete request head (idle, or headers trickling).
    idle_timeout: float = 10.0
    #: Seconds a request body may take to arrive (then 408).
    body_timeout: float = 10.0
    #: ``METEORSEED_STREAM_SHARDS`` of the namespace (``meteorseed serve`` reads the recorded one).
    shards: int = 1
    #: The project's ``REQUEST_FINGERPRINTER_CLASS`` (``meteorseed serve`` run inside a Scrapy
    #: project that sets its own): the dedup keys of dispatch, ``GET /tasks?url=`` and requeue,
    #: as the project's workers compute them. None: canonical URLs.
    fingerprinter: Fingerprinter | None = field(default=None, compare=False, repr=False)
    #: ``METEORSEED_NOTIFY_*``: completion webhooks, delivered by this server when its secret
    #: is set (meteorseed_scrapy.api.webhooks); None: none delivered, private targets refused.
    notify: NotifyConfig | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _ = self.keys  # raises ValueError naming METEORSEED_NAMESPACE or the shard count
        if self.token is not None and not self.token.strip():
            raise ValueError("METEORSEED_API_TOKEN: must not be empty")
        if self.max_body < 1024:
            raise ValueError(f"max_body: must be at least 1024 bytes, got {self.max_body}")
        if self.max_expansions < 1:
            raise ValueError(f"max_expansions: must be at least 1, got {self.max_expansions}")
        for name in ("idle_timeout", "body_timeout"):
            if not getattr(self, name) > 0:  # (also refuses nan)
                raise ValueError(f"{name}: must be > 0 seconds, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections: must be at least 1, got {self.max_connections}")
        if self.max_backlog < 0:
            raise ValueError(f"METEORSEED_MAX_BACKLOG: must be >= 0, got {self.max_backlog}")

    @property
    def keys(self) -> KeyLayout:
        return KeyLayout(self.namespace, self.shards, is_cluster_url(self.redis_url))


#: Application key of the config (set once by :func:`meteorseed_scrapy.api.app.create_app`).
CONFIG = web.AppKey("config", ApiConfig)
