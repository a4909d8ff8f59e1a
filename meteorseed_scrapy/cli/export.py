"""``meteorseed export``: a namespace's documents from the store as JSON Lines, resumable.

Documents come in the store's change order (:meth:`~meteorseed_scrapy.store.base.Store.
export_page`): a document written again after an export comes out again from its cursor; one
left alone does not. At the end the cursor to resume from is printed on stderr, as the last
line, ``cursor=<CURSOR>`` (``--cursor-file`` also keeps it in a file, rewritten after every
page written, so an export killed midway resumes from the last page it completed). The store
is the one workers write to (``METEORSEED_STORE_URI``, ``METEORSEED_NAMESPACE``); Redis is not
asked.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from meteorseed_scrapy.cli.common import CliError, cli_settings
from meteorseed_scrapy.exit_codes import EXIT_ERROR, EXIT_OK
from meteorseed_scrapy.settings import store_uri_from, text_setting
from meteorseed_scrapy.store.backends import open_store
from meteorseed_scrapy.store.base import Store, StoreUnavailable
from meteorseed_scrapy.store.export_cursor import Position, decode_cursor, encode_cursor

PAGE = 1000  # documents per store read


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export", help="the store's documents as JSON Lines, from a cursor; prints the next")
    p.add_argument("--since", metavar="CURSOR", default=None,
                   help="resume after this cursor (printed by the last export); default: "
                        "from the first document, or from --cursor-file when it exists")
    p.add_argument("--site", metavar="SITE", default=None, help="only this site's documents")
    p.add_argument("--seed", metavar="ID", default=None, help="only this seed's documents")
    p.add_argument("--limit", metavar="N", type=_positive, default=None,
                   help="stop after N documents (the cursor resumes after the last)")
    p.add_argument("-o", "--output", metavar="FILE", type=Path, default=None,
                   help="append to FILE instead of writing to stdout")
    p.add_argument("--cursor-file", metavar="FILE", type=Path, default=None,
                   help="read the cursor from FILE when --since is not given, and keep the "
                        "cursor there, updated after every page written")
    p.add_argument("--store-uri", metavar="URI", default=None,
                   help="the store (default: METEORSEED_STORE_URI)")
    p.add_argument("--namespace", default=None, help="default: METEORSEED_NAMESPACE")
    p.set_defaults(run_offline=run_export)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _start(args: argparse.Namespace, kind: str) -> Position | None:
    since, where = args.since, "--since"
    if since is None and args.cursor_file is not None and args.cursor_file.exists():
        try:
            since = args.cursor_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--cursor-file: {exc}") from None
        where = "--cursor-file"
    if not since:
        return None
    try:
        return decode_cursor(since.strip(), kind)
    except ValueError as exc:
        raise CliError(f"{where}: {exc}") from None


def _keep_cursor(path: Path, cursor: str) -> None:
    """Write ``cursor`` to ``path`` whole or not at all (a kill never leaves half of one)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(cursor + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def run_export(args: argparse.Namespace, out: IO[str], err: IO[str], _stdin: IO[str]) -> int:
    settings = cli_settings()
    uri = args.store_uri or store_uri_from(settings)
    namespace = args.namespace or text_setting(settings, "METEORSEED_NAMESPACE")
    try:
        store = open_store(uri, namespace)
    except ValueError as exc:
        raise CliError(f"--store-uri: {exc}") from None
    with ExitStack() as stack:
        stack.callback(store.close)
        if not store.export_kind:
            raise CliError(f"this store ({type(store).__name__}) has no change order to export")
        after = _start(args, store.export_kind)
        sink = out
        if args.output is not None:
            try:
                sink = stack.enter_context(args.output.open("a", encoding="utf-8"))
            except OSError as exc:
                raise CliError(f"--output: {exc}") from None
        try:
            count, after = _copy(store, after, args, sink)
        except StoreUnavailable as exc:
            print(f"meteorseed: the store is unavailable: {exc}", file=err)
            return EXIT_ERROR
    cursor = encode_cursor(store.export_kind, after) if after is not None else ""
    if args.cursor_file is not None and cursor:
        _keep_cursor(args.cursor_file, cursor)
    print(f"exported {count} document(s); resume with --since {cursor or '(none yet)'}",
          file=err)
    print(f"cursor={cursor}", file=err)
    return EXIT_OK


def _copy(store: Store, after: Position | None, args: argparse.Namespace,
          sink: IO[str]) -> tuple[int, Position | None]:
    count = 0
    # Files get UTF-8 as is; a terminal or pipe gets ASCII JSON (no raw control or bidi
    # characters from stored text reach a terminal).
    ascii_only = args.output is None
    while args.limit is None or count < args.limit:
        size = PAGE if args.limit is None else min(PAGE, args.limit - count)
        page = store.export_page(after, size, site_id=args.site, seed_id=args.seed)
        if not page:
            break
        sink.write("".join(json.dumps(doc, ensure_ascii=ascii_only, separators=(",", ":"))
                           + "\n" for _, doc in page))
        sink.flush()
        count += len(page)
        after = page[-1][0]
        if args.cursor_file is not None:
            _keep_cursor(args.cursor_file, encode_cursor(store.export_kind, after))
        if len(page) < size:
            break
    return count, after


__all__ = ["register", "run_export"]
