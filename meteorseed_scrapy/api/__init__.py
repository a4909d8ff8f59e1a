"""``meteorseed serve``: the HTTP dispatch API (seeds in, counts out) and the console's data.

See docs/api.md. :func:`create_app` builds the aiohttp application from an
:class:`ApiConfig`; ``meteorseed_scrapy.cli.serve`` runs it.
"""

from __future__ import annotations

from meteorseed_scrapy.api.app import create_app
from meteorseed_scrapy.api.config import ApiConfig

__all__ = ["ApiConfig", "create_app"]
