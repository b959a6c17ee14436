"""The estimate's task line never gives ``task.eval_size`` as the task's size (issue 49): the
probe counts distinct held-out problems only up to eval_size, so a count that reaches it says
that eval_size is met and the task may hold more, and a count under it is the task's own."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, tiny_config

pytestmark = pytest.mark.services


def task_line(api: Api, task: dict[str, object]) -> dict[str, object]:
    check = api.post("/api/runs/estimate", json={"config": tiny_config(2, task=task)}).json()
    assert check["task"] is not None and check["task"]["checked"], check
    return check["task"]


def test_a_count_that_reaches_eval_size_is_not_told_as_the_tasks_size(api: Api) -> None:
    # 2-digit sums of three operands: far more than 20 held-out problems exist
    met = task_line(api, {"name": "arith", "params": {"digits": 2}, "eval_size": 20})
    assert met["held_out"] == 20 and not met["refused"], met
    assert met["text"] != "20 distinct held-out problems", met
    assert "task.eval_size" in str(met["text"]) and "may hold more" in str(met["text"]), met
    # 1-digit pairs: 16 exist, fewer than the default 64 it asks for: the task's own count
    small = task_line(api, {"name": "arith", "params": {"num_operands": 2}})
    assert small["held_out"] == 16 and "may hold more" not in str(small["text"]), small
