"""A request fingerprinter that fails for URLs with ``fpfail`` in them (a project's bug)."""

from __future__ import annotations

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter


class FailingFingerprinter(RequestFingerprinter):
    def fingerprint(self, request: Request) -> bytes:
        if "fpfail" in request.url:
            raise ValueError(f"cannot fingerprint {request.url}")
        return super().fingerprint(request)
