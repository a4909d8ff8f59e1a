"""Numbers and prices in page text, read strictly: a value is right or refused, never guessed.

:func:`read_number` takes the first number of a text with a known decimal separator and checks
its digit grouping: ``1,299.00``, ``1 299,50``, ``1'234.50``, ``12,34,567`` (Indian lakh
grouping) are read; ``1,2,3`` or ``1,234.567`` under the wrong separator are refused
(:class:`~meteorseed_scrapy.sites.processors.ProcessorError` via ``ValueError``), because any
reading of them is a guess. A leading ``.`` (``.99``) and the Unicode minus (U+2212) are
read; text is NFKC-normalised first, so full-width digits and separators count too.

:func:`read_price` lets ``price-parser`` find the amount, its currency and (unless the rule
gives it) the decimal separator, then reads the amount with the same strict grouping check.
"""

from __future__ import annotations

import math
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Any

from meteorseed_scrapy.sites.shown import shown

#: Thousands separators besides the other decimal character: apostrophes (de-CH) and a space
#: (after NFKC, no-break and narrow no-break spaces are plain spaces).
_GROUP_MARKS = "'\u2019 "
_MINUS = "-\u2212"
#: An optional sign not glued to a word ("SKU-123" is 123, not -123); then digits, or a
#: separator and digits not glued to a word (".99", but "No.5" is 5); separators only between
#: digits, a space only before a group of exactly three ("12.00 2 items" is 12.00).
_TOKEN = re.compile(r"(?:(?<![\w.,])([+\-\u2212]))?((?:\d|(?<!\w)[.,]\d)\d*"
                    r"(?:(?:[.,'\u2019]|\ (?=\d{3}(?!\d)))\d+)*)")
#: Longer number texts are refused: nothing a page means by a price or count.
MAX_DIGITS = 40
INT_MAX = 2**63 - 1  # what SQLite and MongoDB store as an integer


class NumberError(ValueError):
    """Text holds no number, or one whose separators allow more than one reading."""


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def _grouped(integer: str, decimal: str) -> str:
    """``integer`` without its thousands separators, or :class:`NumberError`."""
    marks = {c for c in integer if not c.isdigit()}
    if not marks:
        return integer
    if len(marks) > 1:
        raise NumberError(f"mixed separators in {integer!r}")
    mark = marks.pop()
    if mark == decimal or mark not in _GROUP_MARKS + ".,":
        raise NumberError(f"ambiguous separators in {integer!r}")
    groups = integer.split(mark)
    western = 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])
    # en-IN: 12,34,567 (the last group three digits, the ones before it two)
    lakh = (mark == "," and len(groups) > 2 and 1 <= len(groups[0]) <= 2
            and all(len(g) == 2 for g in groups[1:-1]) and len(groups[-1]) == 3)
    if not (western or lakh):
        raise NumberError(f"ambiguous separators in {integer!r}")
    return "".join(groups)


def parse_amount(body: str, decimal: str) -> Decimal:
    """The digits and separators of one number (no sign) as a Decimal, checked strictly."""
    if body.count(decimal) > 1:
        raise NumberError(f"ambiguous separators in {body!r}")
    integer, _, fraction = body.partition(decimal)
    if fraction and not fraction.isdigit():
        raise NumberError(f"ambiguous separators in {body!r}")
    whole = _grouped(integer, decimal)
    if not (whole or fraction):
        raise NumberError(f"no number in {body!r}")
    if len(whole) + len(fraction) > MAX_DIGITS:
        raise NumberError(f"more than {MAX_DIGITS} digits")
    try:
        return Decimal(f"{whole or 0}.{fraction or 0}")
    except InvalidOperation:
        raise NumberError(f"not a number: {body!r}") from None


def read_number(value: Any, decimal: str) -> Decimal | float | int:
    """The first number in ``value`` (text), or a JSON number as it is."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise NumberError(f"expected text or a number, got {shown(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberError(f"not a finite number: {value!r}")
    if not isinstance(value, str):
        return value
    match = _TOKEN.search(normalise(value))
    if match is None:
        raise NumberError(f"no number in {value[:80]!r}")
    sign, body = match.groups()
    amount = parse_amount(body, decimal)
    return -amount if sign and sign in _MINUS else amount


def to_float(number: Decimal | float | int) -> float:
    result = float(number)
    if not math.isfinite(result):
        raise NumberError(f"out of range: {str(number)[:40]}")
    return result


def to_int(number: Decimal | float | int) -> int:
    if isinstance(number, float) and not number.is_integer():
        raise NumberError(f"not a whole number: {number!r}")
    if isinstance(number, Decimal) and number != number.to_integral_value():
        raise NumberError(f"not a whole number: {number}")
    whole = int(number)
    if not -INT_MAX - 1 <= whole <= INT_MAX:
        raise NumberError(f"out of the 64-bit range: {str(number)[:40]}")
    return whole


def read_price(value: Any, decimal: str | None, currency: str | None
               ) -> tuple[float, str | None]:
    """Amount and currency of a price text (price-parser), the amount checked strictly."""
    from price_parser import Price  # imported on first use: only price rules pay for it

    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise NumberError(f"expected a price text, got {shown(value)}")
    if not isinstance(value, str):
        return to_float(read_number(value, "." if decimal is None else decimal)), currency
    text = normalise(value).replace("\u2212", "-")
    price = Price.fromstring(text, currency_hint=currency, decimal_separator=decimal)
    if price.amount is None or not price.amount_text:
        raise NumberError(f"no price in {value[:80]!r}")
    amount_text = price.amount_text.strip()
    # Read again with each separator price-parser may have meant: the amount must be one of
    # the strict readings, else its text ("1,234.567") allows no reading at all.
    readings = []
    for separator in (decimal,) if decimal else (".", ","):
        try:
            readings.append(parse_amount(amount_text.lstrip("+-"), separator))
        except NumberError:
            continue
    if price.amount not in readings:
        raise NumberError(f"ambiguous separators in {amount_text!r}")
    amount = price.amount
    start = text.find(amount_text)
    before = text[:max(start, 0)].rstrip()
    if price.currency and before.endswith(price.currency):
        before = before[:-len(price.currency)].rstrip()
    if amount_text.startswith("-") or (start >= 0 and before.endswith("-")):
        amount = -amount  # price-parser drops the sign: "-5,00 €", "€ -5,00" are refunds
    return to_float(amount), price.currency or currency
