"""Peak RSS and time to ack of one worker given a pathological response (issue 22.5).

``--case gzip-bomb``: a page whose gzip body (about 1 MB) decompresses to ``--size`` MiB
(1024: the issue's 1 GiB) of zeros. ``--case robots``: a robots.txt of ``--size`` MiB (50:
the issue's) of ``Disallow`` lines before an ordinary page. ``--case headers``: a page with
``--size`` thousand header lines (300: the issue's 9 MB of headers). One ``probe`` worker (the test
project's) crawls one task; the figures are the time from its start to the task's
completion record and its peak RSS (``VmHWM``). ``--uncapped`` runs with Scrapy's own
limits instead of the add-on's caps (``DOWNLOAD_MAXSIZE`` 1 GiB, the whole robots.txt
parsed, any number of header lines): the code before the caps. The longest event-loop block
the worker logged is reported too.

    .venv/bin/python benchmarks/response_caps.py --case gzip-bomb
    .venv/bin/python benchmarks/response_caps.py --case gzip-bomb --uncapped
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

from pathological_page import (  # noqa: E402
    REPO,
    acked_text,
    longest_stall,
    serve_pages,
    until_acked,
)

UNCAPPED = {"DOWNLOAD_MAXSIZE": 1024 ** 3, "DOWNLOAD_WARNSIZE": 32 * 1024 ** 2,
            "METEORSEED_ROBOTSTXT_MAXSIZE": 1024 ** 3, "METEORSEED_MAX_RESPONSE_HEADERS": 0,
            "METEORSEED_RESPONSE_HEADERS_MAXSIZE": 0}
PAGE = b"<html><title>ok</title><body>ok</body></html>"


def gzip_of_zeros(mib: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # (31: the gzip container)
    chunk = b"\0" * 1024 * 1024
    return b"".join([*(packer.compress(chunk) for _ in range(mib)), packer.flush()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=("gzip-bomb", "robots", "headers"), required=True)
    parser.add_argument("--size", type=int, default=0, help="MiB (default: the issue's)")
    parser.add_argument("--uncapped", action="store_true", help="Scrapy's limits, not ours")
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose add-on runs")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    settings: dict[str, object] = dict(UNCAPPED) if args.uncapped else {}
    if args.case == "gzip-bomb":
        size = args.size or 1024
        bomb = gzip_of_zeros(size)
        site = serve_pages(lambda path: (bomb, {"Content-Encoding": "gzip"}))
        what = f"a gzip bomb of {len(bomb) / 1e6:.1f} MB -> {size} MiB"
    elif args.case == "headers":
        size = args.size or 300
        headers = {f"X-Header-{i:07d}": "v" * 12 for i in range(size * 1000)}
        site = serve_pages(lambda path: (PAGE, headers))
        what = f"a page with {size * 1000} header lines ({size * 1000 * 29 / 1e6:.1f} MB)"
    else:
        size = args.size or 50
        lines = range(size * 1024 * 1024 // 27)
        rules = b"".join(b"Disallow: /private/%07d\n" % i for i in lines)
        robots = b"User-agent: *\n" + rules + b"Allow: /\n"  # (a rule per line: parsed)
        site = serve_pages(lambda path: (robots if path == "/robots.txt" else PAGE,
                                         {"Content-Type": "text/plain"} if
                                         path == "/robots.txt" else {}))
        settings["ROBOTSTXT_OBEY"] = True
        what = f"a robots.txt of {size} MiB"
    url = f"http://127.0.0.1:{site.server_address[1]}/page"
    acked, peak, work = until_acked(args.code.resolve(), url, args.timeout, settings)
    site.shutdown()
    print(f"{what}{' (uncapped)' if args.uncapped else ''}: task {acked_text(acked, args.timeout)}"
          f", worker peak RSS {peak:.0f} MB, {longest_stall(work)}; log in {work}")


if __name__ == "__main__":
    main()
