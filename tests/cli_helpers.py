"""The ``meteorseed`` command line run in this process against one Redis and namespace."""

from __future__ import annotations

import io
import json
from typing import Any

from meteorseed_scrapy.cli import main


def cli(redis_url: str, namespace: str, *argv: str) -> tuple[int, str, str]:
    """``meteorseed ARGV --redis-url URL --namespace NS``: its exit code, stdout and stderr
    (stdin empty)."""
    out, err = io.StringIO(), io.StringIO()
    code = main([*argv, "--redis-url", redis_url, "--namespace", namespace],
                stdin=io.StringIO(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def cli_json(redis_url: str, namespace: str, *argv: str) -> tuple[int, Any]:
    """:func:`cli`, its stdout decoded from JSON (else stdout and stderr as one text)."""
    code, out, err = cli(redis_url, namespace, *argv)
    try:
        return code, json.loads(out)
    except ValueError:
        return code, out + err
