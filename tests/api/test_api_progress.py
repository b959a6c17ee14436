"""One ETA, computed on the server from the run's pace (issue 37 item 4: the runs list said
27 min and rising while the run page said 16 min, frozen; "–" for the first minutes; an ETA on a
run being cancelled). ``backend.runs.progress``: every write that advances the step folds the
time since the last step into ``pace_s``; ``eta_s`` = pace × steps left − time since the last.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.services


def log_at(api: Api, run_id: int, wall: float, *steps: int) -> dict[str, Any]:
    body = {"steps": [{"step": s, "metrics": {"sep/gap": 0.1}, "wall_time": wall} for s in steps]}
    assert api.post(f"/api/runs/{run_id}/log", json=body).status_code == 200
    return api.get(f"/api/runs/{run_id}").json()


def test_the_pace_folds_every_step_and_the_eta_counts_what_is_left(api: Api) -> None:
    name = f"pace-{uuid.uuid4().hex[:8]}"  # the session's database holds other tests' runs
    run = api.external(name=name, total_steps=20)
    now = time.time()
    first = log_at(api, run["id"], now - 60, 1)  # no earlier step to measure from
    assert first["pace_s"] is None and first["eta_s"] is None
    assert log_at(api, run["id"], now - 50, 2)["pace_s"] == pytest.approx(10)
    # a step of 40 s (an evaluation, say) weighs a third at step 3 (a running mean so far)
    assert log_at(api, run["id"], now - 10, 3)["pace_s"] == pytest.approx(20)
    # two steps in one write: one sample of 5 s per step, weighing 2/5
    run_now = log_at(api, run["id"], now, 4, 5)
    assert run_now["pace_s"] == pytest.approx(20 + 0.4 * (5 - 20))
    assert run_now["eta_s"] == pytest.approx(14 * 15, abs=5)  # 15 steps left at 14 s each
    # a step logged again (a resumed attempt re-emits it) moves neither the pace nor the clock
    again = log_at(api, run["id"], now + 100, 5)
    assert again["pace_s"] == pytest.approx(run_now["pace_s"])
    assert again["eta_s"] == pytest.approx(run_now["eta_s"], abs=5)
    # the list says the same as the run
    listed = api.get("/api/runs", params={"q": name}).json()["items"]
    (same,) = [r for r in listed if r["id"] == run["id"]]
    assert same["eta_s"] == pytest.approx(again["eta_s"], abs=5)


def test_no_eta_while_cancelling_or_once_finished(api: Api) -> None:
    run = api.external(total_steps=10)
    now = time.time()
    log_at(api, run["id"], now - 10, 1)
    assert log_at(api, run["id"], now, 2)["eta_s"] is not None
    closed = api.post(f"/api/runs/{run['id']}/log", json={"steps": [], "status": "succeeded"})
    assert closed.status_code == 200
    assert api.get(f"/api/runs/{run['id']}").json()["eta_s"] is None


def test_a_run_being_cancelled_has_no_eta() -> None:
    from backend.models import Run, RunStatus
    from backend.runs.progress import eta_s

    now = time.time()
    fields = {"status": RunStatus.running, "pace_s": 10.0, "last_step_at": now, "step": 2,
              "total_steps": 10}  # fmt: skip
    assert eta_s(Run(**fields, cancel_requested=False), now) == pytest.approx(80)
    assert eta_s(Run(**fields, cancel_requested=True), now) is None
    assert eta_s(Run(**fields, cancel_requested=False), now + 500) == 0  # overdue: due now


def test_a_first_write_of_several_steps_has_a_pace_from_its_own_steps(api: Api) -> None:
    """An external run (TRL's callback, a script) may log many steps in its first write: no
    earlier step to measure from, but the write's own steps give the pace."""
    run = api.external(total_steps=20)
    now = time.time()
    body = {
        "steps": [
            {"step": s, "metrics": {"sep/gap": 0.1}, "wall_time": now - 10 * (5 - s)}
            for s in range(1, 6)
        ]
    }
    assert api.post(f"/api/runs/{run['id']}/log", json=body).status_code == 200
    state = api.get(f"/api/runs/{run['id']}").json()
    assert state["pace_s"] == pytest.approx(10) and state["eta_s"] == pytest.approx(150, abs=5)
