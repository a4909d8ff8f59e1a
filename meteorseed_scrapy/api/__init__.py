"""``meteorseed serve``: the HTTP dispatch API (seeds in, counts out) and the console's data.

See docs/api.md. :func:`meteorseed_scrapy.api.app.create_app` builds the aiohttp application
from an :class:`~meteorseed_scrapy.api.config.ApiConfig`; ``meteorseed_scrapy.cli.serve`` runs it.
"""
