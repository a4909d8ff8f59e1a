"""``meteorseed sites try SITE URL|FILE``: one page through a site's rules, ``scrapy parse``-like.

The page is fetched with one plain blocking GET carrying the site's ``headers`` and first
``user_agents`` entry (else Scrapy's default User-Agent), redirects followed, within the site's
``limits.timeout`` (else 30 s); or read from a local file (``--url`` says which page it was,
for relative links and ``from_url`` fields; without it the file is read as a page of the site,
``https://<its first allowed domain>/<file name>``). A page the site's rules refuse (off its
allowed domains, blacklisted) is not parsed, and the error says why; a page without items says
why too. Then the ``sites`` spider's own callback parses it,
so what is printed is what a worker would store: each item's fields, processed value beside
the raw text, its anomalies, and the links it would follow (and those it skips, with why).
robots.txt, proxies, rate limits and rendering do not apply to this one fetch. Exit 1 when an
item has anomalies or the page yields no item, so it can gate a rule change in CI.
"""

from __future__ import annotations

import argparse
import os
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import quote

from scrapy import Request
from scrapy.http import HtmlResponse, TextResponse
from scrapy.settings.default_settings import USER_AGENT

from meteorseed_scrapy.cli.common import CliError, Context
from meteorseed_scrapy.exit_codes import EXIT_INCOMPLETE, EXIT_OK
from meteorseed_scrapy.sites.links import links
from meteorseed_scrapy.sites.loader import SiteRegistry
from meteorseed_scrapy.sites.model import Selector, SiteConfig
from meteorseed_scrapy.sites.pipeline import SiteItem
from meteorseed_scrapy.sites.reader import RuleError
from meteorseed_scrapy.sites.rulefile import SUFFIXES, FileResult, load_file
from meteorseed_scrapy.task.json_depth import MAX_RESPONSE_DEPTH, loads_bounded

#: bytes read of a fetched page at most (a page larger than this is not a page to try rules on)
MAX_BODY = 32 * 1024 * 1024
CALLBACKS = ("parse", "parse_list", "parse_detail")


@dataclass
class Loaded:
    configs: dict[str, SiteConfig] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    errors: list[RuleError] = field(default_factory=list)


def offline_context(args: argparse.Namespace, out: IO[str], err: IO[str],
                    stdin: IO[str]) -> Context:
    """Printing as every subcommand prints, for commands that never connect to Redis."""
    return Context(cast(Any, None), cast(Any, None), "", bool(getattr(args, "json", False)),
                   out, err, stdin)


def load_rules(paths: Iterable[Path]) -> Loaded:
    """Every rule file of the given directories and files, validated as a worker would; a
    site_id defined twice is an error naming both files."""
    loaded = Loaded()
    for given in paths:
        if given.is_dir():
            files = sorted(p for p in given.iterdir() if p.suffix in SUFFIXES)
            if not files:
                loaded.errors.append(RuleError(str(given), "", "no rule files"
                                                 f" ({', '.join(SUFFIXES)})"))
        elif given.exists():
            files = [given]
        else:
            loaded.errors.append(RuleError(str(given), "", "no such file or directory"))
            continue
        for path in files:
            try:
                config = load_file(path)
            except RuleError as exc:
                loaded.errors.append(exc)
                continue
            if config.site_id in loaded.configs:
                loaded.errors.append(RuleError(str(path), "site_id", f"{config.site_id!r} is"
                                                 f" already defined in"
                                                 f" {loaded.paths[config.site_id]}"))
                continue
            loaded.configs[config.site_id], loaded.paths[config.site_id] = config, path
    return loaded


def register(actions: Any) -> None:
    p = actions.add_parser("try", help="parse one page (URL or local file) with a site's rules"
                           " and print items, raw values, anomalies and links; no Redis")
    p.add_argument("site_id", metavar="SITE")
    p.add_argument("target", metavar="URL|FILE")
    p.add_argument("--sites-dir", type=Path, help="rule files (default: env"
                   " METEORSEED_SITES_DIR, else the Scrapy project's setting)")
    p.add_argument("--url", help="for a FILE: the page URL it was saved from")
    p.add_argument("--callback", choices=CALLBACKS, default="parse",
                   help="parse as a seed page (default: the site's start), a list or a detail")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run_offline=run_try)


def _sites_dir(given: Path | None) -> Path:
    if given is not None:
        return given
    env = os.environ.get("METEORSEED_SITES_DIR")
    if env:
        return Path(env)
    from scrapy.utils.conf import closest_scrapy_cfg

    if closest_scrapy_cfg():
        from scrapy.utils.project import get_project_settings

        value = get_project_settings().get("METEORSEED_SITES_DIR")
        if value:
            return Path(str(value))
    raise CliError("no rule files: pass --sites-dir DIR or set METEORSEED_SITES_DIR")


def fetch(config: SiteConfig, url: str) -> tuple[str, int, dict[str, str], bytes]:
    """One blocking GET with the site's headers: final URL, status, headers, body."""
    headers = {k: v for k, v in config.headers.items() if k.lower() != "accept-encoding"}
    headers["User-Agent"] = config.user_agents[0] if config.user_agents else USER_AGENT
    timeout = config.limits.timeout or 30.0
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read(MAX_BODY + 1)
            status, final, got = answer.status, answer.geturl(), dict(answer.headers.items())
    except urllib.error.HTTPError as exc:
        raise CliError(f"{url}: HTTP {exc.code} {exc.reason}: not parsed (as Scrapy's"
                       " HttpErrorMiddleware drops it)", EXIT_INCOMPLETE) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CliError(f"{url}: cannot fetch: {getattr(exc, 'reason', exc)}",
                       EXIT_INCOMPLETE) from None
    if len(body) > MAX_BODY:
        raise CliError(f"{url}: larger than {MAX_BODY} bytes", EXIT_INCOMPLETE)
    return final, status, got, body


def _response(ctx: Context, config: SiteConfig, args: argparse.Namespace) -> TextResponse:
    target: str = args.target
    if target.startswith(("http://", "https://")):
        _refused(config, target)
        url, status, headers, body = fetch(config, target)
    else:
        path = Path(target)
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise CliError(f"{target}: cannot read: {exc.strerror or exc}") from None
        url, status, headers = args.url or _page_url(ctx, config, path), 200, {}
    _refused(config, url)  # (a fetched page: where its redirects ended)
    cls = HtmlResponse if config.format == "html" else TextResponse
    request = Request(url, meta={"site_id": config.site_id})
    return cls(url, status=status, headers=headers, body=body, request=request)


def _page_url(ctx: Context, config: SiteConfig, path: Path) -> str:
    """Where a saved page given without ``--url`` is taken to be: on the site, so that its
    rules apply (a ``file:`` URL is on none of its allowed domains)."""
    if not config.allowed_domains:
        return path.resolve().as_uri()
    url = f"https://{config.allowed_domains[0]}/{quote(path.name)}"
    ctx.warn(f"{path} read as {url}, a page of site {config.site_id}: pass --url with the"
             " address it was saved from, for its links and URL fields")
    return url


def _refused(config: SiteConfig, url: str) -> None:
    why = config.refusal(url)
    if why is not None:
        raise CliError(f"{url}: not parsed: {why} (a worker refuses it too)", EXIT_INCOMPLETE)


def _no_item(config: SiteConfig) -> str:
    """Why a page the site's rules accepted gave no item (a detail page always gives one)."""
    if config.list_items is None:
        return (f"no item: this page was parsed as a list page, and site {config.site_id}'s"
                " list pages carry none (no list.items rule; its items come from detail pages:"
                " --callback parse_detail parses it as one)")
    return f"no item: list.items ({_selector(config.list_items)}) matched nothing on this page"


def _selector(rule: Selector) -> str:
    return ", ".join(f"{name} {value if isinstance(value, str) else value.pattern!r}"
                     for name in ("css", "xpath", "path", "jmespath", "attr", "regex")
                     if (value := getattr(rule, name)) is not None) or "the page URL"


def site_rules(sites_dir: Path | None, site_id: str) -> tuple[SiteConfig, Path]:
    """The valid rules of ``site_id`` in the rules directory and their file, else a
    :class:`CliError` naming the valid sites and every problem found (``sites try`` and
    ``sites reparse``)."""
    loaded = load_rules([_sites_dir(sites_dir)])
    config = loaded.configs.get(site_id)
    if config is None:
        problems = "".join(f"\n  {e}" for e in loaded.errors)
        raise CliError(f"no valid rules for site {site_id!r} (valid:"
                       f" {', '.join(sorted(loaded.configs)) or 'none'}){problems}")
    return config, loaded.paths[site_id]


def run_try(args: argparse.Namespace, out: IO[str], err: IO[str], stdin: IO[str]) -> int:
    ctx = offline_context(args, out, err, stdin)
    config, path = site_rules(args.sites_dir, args.site_id)
    response = _response(ctx, config, args)
    # Imported here: the spider brings Twisted, which `meteorseed status` need not load.
    from meteorseed_scrapy.sites.spider import RuleSpider

    registry = SiteRegistry(None)
    registry.apply([FileResult(path, (0, 0), config=config)])
    spider = RuleSpider(registry=registry, reload_interval=0)
    try:
        output = list(getattr(spider, args.callback)(response))
        skipped = _skipped(config, response, args.callback)
    except ValueError as exc:  # e.g. a json site's page that is not JSON
        raise CliError(f"{response.url}: not parsed: {exc}"[:500], EXIT_INCOMPLETE) from None
    items = [o for o in output if isinstance(o, SiteItem)]
    followed = [{"url": o.url, "callback": getattr(o.callback, "__name__", str(o.callback))}
                for o in output if isinstance(o, Request)]
    if ctx.json:
        ctx.emit_json({"site_id": config.site_id, "version": config.version,
                       "url": response.url, "callback": args.callback,
                       "items": [{"unique_key": i.key, "fields": i.fields, "raw": i.raw,
                                  "anomalies": i.reasons} for i in items],
                       "no_item": None if items else _no_item(config),
                       "follow": followed, "skipped": skipped})
    else:
        _print(ctx, config, response.url, items, followed, skipped,
               None if items else _no_item(config))
    return EXIT_INCOMPLETE if not items or any(i.reasons for i in items) else EXIT_OK


def _skipped(config: SiteConfig, response: TextResponse, callback: str) -> list[dict[str, Any]]:
    """The links the callback's link rules find but do not follow, with why."""
    as_list = callback == "parse_list" or (callback == "parse" and config.start == "list")
    rules = ([("list.links", config.list_links), ("list.pagination", config.pagination)]
             if as_list else [("detail.links", config.detail_links)])
    scope = (loads_bounded("response", response.text, MAX_RESPONSE_DEPTH, unique=False)
             if config.format == "json" else response.selector)
    return [{"rule": name, "url": link.url, "reason": link.skipped}
            for name, rule in rules if rule is not None
            for link in links(config, scope, rule, response) if link.skipped is not None]


def _print(ctx: Context, config: SiteConfig, url: str, items: list[SiteItem],
           followed: list[dict[str, str]], skipped: list[dict[str, Any]],
           no_item: str | None) -> None:
    ctx.say(f"site {config.site_id} version {config.version} ({config.source}): {url}")
    for number, item in enumerate(items, 1):
        ctx.say(f"\nitem {number} of {len(items)}"
                + (f" (unique_key {item.key})" if item.key is not None else ""))
        for name, value in item.fields.items():
            ctx.say(f"  {name} = {value!r}")
            ctx.say(f"  {' ' * len(name)}   raw {item.raw.get(name, '')!r}")
        for reason in item.reasons:
            ctx.say(f"  ANOMALY {reason}")
    if no_item is not None:
        ctx.say(f"\n{no_item}")
    ctx.say(f"\nfollows {len(followed)} links")
    for link in followed:
        ctx.say(f"  {link['callback']} {link['url']}")
    for link in skipped:
        ctx.say(f"  skipped {link['url']} ({link['rule']}: {link['reason']})")
