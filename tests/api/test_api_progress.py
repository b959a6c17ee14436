"""One ETA, computed on the server from the run's pace (issue 37 item 4: the runs list said
27 min and rising while the run page said 16 min, frozen; "–" for the first minutes; an ETA on a
run being cancelled). ``backend.runs.progress``: every write that advances the step folds the
time since the last step into ``pace_s``; ``eta_s`` = pace × steps left − time since the last.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from tests.api.conftest import Api, run_in_worker, tiny_config

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


# Issue 49: a run evaluated for 6 minutes at "0/10, ETA –", and its ETA said 66 minutes for a run
# of 15: the step-0 evaluation was folded into the first step's pace and the last evaluation was
# left out. Evaluations are timed apart (time/eval_s) and reported as the run's phase.


def test_a_run_says_it_is_evaluating_while_it_evaluates(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run through the worker's code: each evaluation waits at a gate until the test has
    read the run from the API, so what the API says mid-evaluation is observed, not raced."""
    import conspo.training.loop as loop

    evaluating, release = threading.Semaphore(0), threading.Semaphore(0)
    real = loop._eval_metrics

    def gated(state: Any, step: int) -> dict[str, float]:
        evaluating.release()
        assert release.acquire(timeout=120), "the test never released the evaluation"
        return real(state, step)

    monkeypatch.setattr(loop, "_eval_metrics", gated)
    name = f"phase-{uuid.uuid4().hex[:8]}"
    config = tiny_config(2, name=name, eval={"every": 0, "at_start": True, "pass_k": 1})
    done: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: done.append(run_in_worker(api, config)))
    worker.start()
    try:
        seen = []
        for _ in range(2):  # the start's evaluation (step 0), then the last step's
            assert evaluating.acquire(timeout=300), "no evaluation started"
            (run,) = [r for r in api.get("/api/runs", params={"q": name}).json()["items"]]
            seen.append(run)
            release.release()
    finally:
        for _ in range(2):
            release.release()  # a failed assertion must not leave the worker at its gate
        worker.join(timeout=300)
    assert [r["phase"] for r in seen] == ["evaluating", "evaluating"]
    assert seen[0]["status"] == "running" and seen[0]["step"] == 0
    assert seen[0]["eta_s"] is None  # no step timed yet: the page says "evaluating", not "–"
    (finished,) = done
    assert finished["status"] == "succeeded" and finished["phase"] is None
    assert finished["summary"]["time/eval_s"] > 0


def test_evaluations_are_timed_apart_from_the_steps() -> None:
    """The issue's run, replayed: 10 steps of 18 s, a 360 s evaluation at step 0 and one at the
    end (eval.every 10). Each step's write folds its time less its evaluation's; the ETA is the
    steps left at that pace plus the evaluations still due."""
    from sqlalchemy import create_engine, select, update
    from sqlalchemy.orm import Session

    from backend.models import Base, Run, RunStatus
    from backend.runs.progress import eta_s, pace_values

    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    step_s, eval_s, total = 18.0, 360.0, 10
    claimed = 1_000_000.0
    config = {"eval": {"every": 10, "at_start": True, "pass_k": 1}, "task": {"eval_size": 200}}
    with Session(engine) as session:
        run = Run(name="replay", task="arith", model="tiny", config=config, summary={},
                  status=RunStatus.running, total_steps=total, step=0,
                  last_step_at=claimed)  # fmt: skip
        session.add(run)
        session.commit()

        def write(step: int, wall: float, evaluated: float = 0.0) -> Run:
            values = pace_values(step, wall, None, evaluated, evaluated)
            session.execute(update(Run).where(Run.id == run.id).values(**values))
            session.execute(update(Run).where(Run.id == run.id, Run.step < step).values(step=step))
            if evaluated:
                summary = {"time/eval_s": evaluated}
                session.execute(update(Run).where(Run.id == run.id).values(summary=summary))
            session.commit()
            return session.scalars(select(Run).where(Run.id == run.id)).one()

        wall = claimed + eval_s
        write(0, wall, eval_s)  # the start's evaluation: no step, the clock moves on by it
        for step in range(1, total + 1):
            wall += step_s + (eval_s if step == total else 0)
            state = write(step, wall, eval_s if step == total else 0.0)
            assert state.pace_s == pytest.approx(step_s)
            if step < total:
                left = (total - step) * step_s + eval_s  # the last evaluation is still due
                assert eta_s(state, now=wall) == pytest.approx(left)
                # mid-step, the ETA counts down with the clock
                assert eta_s(state, now=wall + 5) == pytest.approx(left - 5)


def test_evaluations_still_due_and_their_estimate_before_one_is_measured() -> None:
    from backend.models import Run, RunStatus
    from backend.runs.progress import eta_s, eval_seconds, evals_left

    every_4 = {"eval": {"every": 4}}
    assert [evals_left(every_4, s, 10) for s in (0, 3, 4, 8, 9, 10)] == [3, 3, 2, 1, 1, 0]
    assert [evals_left({"eval": {"every": 5}}, s, 10) for s in (0, 5, 9)] == [2, 1, 1]
    assert evals_left({"eval": {"every": 0}}, 0, 10) == 1  # the last step's alone
    # Not measured yet (eval.at_start off): the step's seconds per rollout times the answers an
    # evaluation writes, greedy and pass@k: 8 prompts × 4 rollouts in 16 s of generation, 20
    # problems × (1 + 2) answers → 30 s.
    config = {"sampling": {"prompts_per_step": 8, "group_size": 4}, "task": {"eval_size": 20},
              "eval": {"every": 0, "pass_k": 2, "at_start": False}}  # fmt: skip
    fields = {"status": RunStatus.running, "pace_s": 20.0, "last_step_at": 0.0, "step": 2,
              "total_steps": 10, "config": config, "external": False}  # fmt: skip
    estimated = Run(**fields, summary={"time/rollout_s": 16.0})
    assert eval_seconds(estimated) == pytest.approx(30)
    assert eta_s(estimated, now=0.0) == pytest.approx(8 * 20 + 30)
    measured = Run(**fields, summary={"time/rollout_s": 16.0, "time/eval_s": 50.0})
    assert eta_s(measured, now=0.0) == pytest.approx(8 * 20 + 50)
    # an external run that logs no evaluation time has none counted
    assert eval_seconds(Run(**{**fields, "external": True}, summary={})) == 0


def test_an_evaluation_not_timed_yet_is_estimated_from_the_step_s_generation() -> None:
    """Every answer an evaluation decodes is counted at the step's seconds per rollout drawn:
    the greedy one and pass_k samples of each held-out problem, and each benchmark's problems k
    times (issue 49: the ETA counted 58 s of evaluation where 211 s were taken). The first
    measured time/eval_s replaces the guess."""
    from backend.models import Run, RunStatus
    from backend.runs.progress import eta_s, eval_rows, eval_seconds

    benchmarks = [{"name": "he", "source": "humaneval", "k": 1},  # 164 problems
                  {"name": "aime", "path": "aime.jsonl", "k": 2, "limit": 30}]  # fmt: skip
    config = {"sampling": {"prompts_per_step": 8, "group_size": 4}, "task": {"eval_size": 20},
              "eval": {"every": 0, "pass_k": 2, "benchmarks": benchmarks}}  # fmt: skip
    assert eval_rows(config) == 20 * (1 + 2) + 164 * 1 + 30 * 2  # 284 answers
    fields = {"status": RunStatus.running, "pace_s": 20.0, "last_step_at": 0.0, "step": 2,
              "total_steps": 10, "config": config, "external": False}  # fmt: skip
    # 64 rollouts drawn in 16 s of generation (8 × 4, refilled once: 4 per s over a 16 s step)
    drawn = {"time/rollout_s": 16.0, "throughput/rollouts_per_s": 4.0, "time/step_s": 16.0}
    estimated = Run(**fields, summary=drawn)
    assert eval_seconds(estimated) == pytest.approx(16 / 64 * 284)  # 71 s
    assert eta_s(estimated, now=0.0) == pytest.approx(8 * 20 + 71)
    measured = Run(**fields, summary={**drawn, "time/eval_s": 50.0})
    assert eval_seconds(measured) == 50 and eta_s(measured, now=0.0) == pytest.approx(8 * 20 + 50)
    # a kind that trains without generating (SFT, DPO): a third of its pace per example (a
    # trained example is a forward and a backward, a decoded answer about a forward)
    sft = {**config, "kind": "sft", "kind_params": {"batch_size": 10}}
    assert eval_seconds(Run(**{**fields, "config": sft}, summary={})) == pytest.approx(2 * 284 / 3)


def test_an_evaluation_under_way_has_an_eta_until_it_ends() -> None:
    """Issue 49: "ETA 0s" while the last evaluation ran. The evaluation under way is its step's
    (logged when it ends): what is left is the evaluation's estimate less its time so far, then
    the steps and evaluations after it; once past its estimate, a quarter of its time so far."""
    from backend.models import Run, RunStatus
    from backend.runs.progress import eta_s

    config = {"eval": {"every": 5, "pass_k": 1}, "task": {"eval_size": 10}}
    fields = {"status": RunStatus.running, "pace_s": 10.0, "last_step_at": 0.0,
              "total_steps": 10, "config": config, "external": False,
              "summary": {"time/eval_s": 100.0}}  # fmt: skip
    # step 5's evaluation, 40 s in (its training took the pace): 60 s of it, 5 steps, 1 eval
    mid = Run(**fields, step=4, phase="evaluating")
    assert eta_s(mid, now=10 + 40) == pytest.approx(60 + 5 * 10 + 100)
    # the last step's evaluation: what is left of it alone, never 0 while it runs
    last = Run(**fields, step=9, phase="evaluating")
    assert eta_s(last, now=10 + 30) == pytest.approx(70)
    assert eta_s(last, now=10 + 400) == pytest.approx(0.25 * 400)  # past its 100 s
    # an evaluation after every step was logged (a trainer that logs the step first)
    after = Run(**fields, step=10, phase="evaluating")
    assert eta_s(after, now=30) == pytest.approx(70)
    assert eta_s(Run(**fields, step=10, phase="training"), now=30) is None  # done: none left
    # the same moment outside an evaluation counts down as before
    assert eta_s(Run(**fields, step=9, phase="training"), now=5) == pytest.approx(10 + 100 - 5)
