"""queue/plumbing/replies.py: a Redis reply as text, from a client that decodes responses or not."""

from __future__ import annotations

import pytest

from meteorseed_scrapy.queue.plumbing.replies import text_of


def test_bytes_and_str_give_the_same_text() -> None:
    assert text_of(b"w\xc3\xa9") == text_of("wé") == "wé"


def test_other_replies_pass_through_str() -> None:
    assert (text_of(3), text_of(None)) == ("3", "None")


def test_a_bad_byte_is_replaced_unless_the_caller_wants_an_error() -> None:
    assert text_of(b"a\xffb") == "a\ufffdb"
    with pytest.raises(UnicodeDecodeError):
        text_of(b"a\xffb", "strict")
