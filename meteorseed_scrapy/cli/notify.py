"""``meteorseed notify``: deliver completion webhooks until SIGINT/SIGTERM, for a deployment
that runs no ``meteorseed serve`` (which delivers them itself when ``METEORSEED_NOTIFY_SECRET``
is set). Any number may run against one namespace, ``serve`` included: they share the
consumer group ``notify`` of ``<ns>:events`` (docs/webhooks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from meteorseed_scrapy.cli.common import (
    CliError,
    Context,
    add_target_options,
    cli_settings,
    resolve_target,
)
from meteorseed_scrapy.exit_codes import EXIT_OK
from meteorseed_scrapy.observability.notify import (
    GROUP,
    SECRET_SETTING,
    Deliverer,
    NotifyConfig,
    registry_lookup,
)
from meteorseed_scrapy.queue.plumbing.connection import async_client
from meteorseed_scrapy.seeding.registry import SeedRegistry
from meteorseed_scrapy.validators import ConfigError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "notify", help="deliver completion webhooks (a seed's notify URL) until stopped",
        description="Read the namespace's finished events (consumer group 'notify') and POST "
        f"each seed's webhook, signed with {SECRET_SETTING}, until SIGINT or SIGTERM (exit "
        "code 0). `meteorseed serve` does the same while it runs.")
    add_target_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, ctx: Context) -> int:
    try:
        config = NotifyConfig.from_settings(cli_settings())
    except ConfigError as exc:
        raise CliError(f"notify: {exc}") from None
    if not config.enabled:
        raise CliError(f"notify: {SECRET_SETTING} is not set: webhooks are signed with it")
    url, _ = resolve_target(args.redis_url, args.namespace)  # (ctx.url is redacted)
    ctx.warn(f"delivering webhooks of {ctx.keys.namespace} (group {GROUP!r} on "
             f"{ctx.keys.events}); stop with Ctrl-C or SIGTERM")
    asyncio.run(_deliver(url, ctx, config))
    return EXIT_OK


async def _deliver(url: str, ctx: Context, config: NotifyConfig) -> None:
    client = async_client(url, decode_responses=True, socket_connect_timeout=5,
                          socket_timeout=30)
    deliverer = Deliverer(client, ctx.keys, config,
                          registry_lookup(SeedRegistry(client, ctx.keys).get))
    task = asyncio.ensure_future(deliverer.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await client.aclose()


__all__ = ["register"]
