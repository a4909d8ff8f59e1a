"""Natural-language and non-English dates (``date_natural``), read by ``dateparser``.

dateparser is the optional ``dates`` extra: ``pip install meteorseed-scrapy[dates]``. A rule
that uses ``date_natural`` without it is refused when its file is loaded, so a worker never
starts with a site whose dates it cannot read. Relative dates (``2 hours ago``, ``hier``) count
from the time the page was fetched; a date without a zone is in the rule's ``tz``. An all-digit
date that reads differently day-first and month-first (``05/03/2024``) is refused unless the
rule gives ``date_order``: the language alone is a guess for such dates.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime, tzinfo
from typing import Any

#: dateparser's DATE_ORDER values
DATE_ORDERS = ("DMY", "MDY", "YMD", "YDM", "DYM", "MYD")
_NUMERIC = re.compile(r"\s*(\d{1,2})\s*[./-]\s*(\d{1,2})\s*[./-]\s*\d{2,4}\b.*")
INSTALL_HINT = "needs the dateparser package: pip install meteorseed-scrapy[dates]"


class DateError(ValueError):
    """No date in the text, or one that allows more than one reading."""


def known_languages() -> frozenset[str]:
    """dateparser's language codes (``fr``, ``pt``, ``zh-Hant``...); ImportError without it."""
    from dateparser.data.languages_info import language_order

    return frozenset(language_order)


class NaturalDates:
    """``text, fetched_at -> aware datetime`` with dateparser, for one rule's options."""

    def __init__(self, languages: Sequence[str], date_order: str | None, zone: tzinfo) -> None:
        import dateparser  # ImportError here is reported at load time, naming the field

        self._parse: Callable[..., Any] = dateparser.parse
        self.languages = list(languages) or None  # None: dateparser detects the language
        self.date_order = date_order
        self.zone = zone

    def __call__(self, text: str, fetched_at: datetime) -> datetime:
        if self.date_order is None:
            numeric = _NUMERIC.fullmatch(text)
            if numeric is not None:
                first, second = (int(g) for g in numeric.groups())
                if first != second and first <= 12 and second <= 12:
                    raise DateError(f"{text[:60]!r} reads as two dates (day or month first):"
                                    " set date_order")
        # Relative dates count from the fetch, in the site's own zone (dateparser's base is
        # a naive local time; "yesterday" in Berlin is a Berlin day).
        base = fetched_at.astimezone(self.zone).replace(tzinfo=None)
        settings: dict[str, Any] = {"RELATIVE_BASE": base, "PREFER_DATES_FROM": "past"}
        if self.date_order is not None:
            settings["DATE_ORDER"] = self.date_order
        try:
            moment = self._parse(text, languages=self.languages, settings=settings)
        except (ValueError, OverflowError) as exc:  # e.g. a day 31 in a 30-day month
            raise DateError(f"no date in {text[:60]!r}: {exc}"[:160]) from None
        if not isinstance(moment, datetime):
            raise DateError(f"no date in {text[:60]!r}")
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=self.zone)
        return moment
