"""A dead letter that holds no task says what was wrong with the message it came from: a
malformed message is dead-lettered as its fields, and read as a task every one of them said
"task_id: is missing"."""

from __future__ import annotations

import json

import pytest

from meteorseed_scrapy.queue.consume.deadletters import DeadLetter
from meteorseed_scrapy.task.exec_task import ExecTask


@pytest.mark.parametrize(("fields", "problem"), [
    ({"v": "9"}, "v: unsupported message version '9'"),
    ({"v": "1", "t": "nope"}, "t: is not valid JSON"),
    ({"v": "1", "t": "{}", "x": "1"}, "x: is not a field of a task message"),
    ({"v": "1"}, "t: is missing"),
])
def test_a_malformed_message_s_letter_names_its_own_problem(fields: dict[str, str],
                                                            problem: str) -> None:
    letter = DeadLetter.decode("1-0", {"t": json.dumps(fields), "reason": "malformed message"})
    assert letter.task is None
    assert letter.error.startswith(f"not a valid task (a malformed message: {problem}")
    assert "task_id: is missing" not in letter.error


def test_a_task_with_a_bad_field_still_names_that_field() -> None:
    task = ExecTask.create(seed_id="s", site_id="news", url="https://news.test/a").to_dict()
    task["priority"] = "high"
    letter = DeadLetter.decode("1-0", {"t": json.dumps(task), "reason": "x"})
    assert letter.task is None and "priority" in letter.error
