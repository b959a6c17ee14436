"""Studies through the API: validation (422 naming the field, nothing stored), the concurrency
limit and the release of pending runs as runs finish (run by the worker's own code), the
verdict, the CSV and report exports, and a search study through Optuna's storage."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from backend.db import Database
from backend.models import RunStatus, Study, StudyRun, utcnow
from backend.runs.queue import JobQueue, make_celery
from tests.api.conftest import Api, tiny_config

pytestmark = pytest.mark.services


def study_body(**extra: Any) -> dict[str, Any]:
    return {
        "name": "grpo-vs-conspo",
        "config": tiny_config(2, eval={"every": 1, "pass_k": 1}),
        "arms": [
            {"name": "grpo", "overrides": {"algorithm": "grpo"}},
            {"name": "conspo", "overrides": {"algorithm": "conspo", "params.tau": 1.0}},
        ],
        "seeds": [0, 1, 2],
        "objective": {"metric": "eval/accuracy", "reduce": "mean_last_k", "k": 2},
        "baseline": "grpo",
        "concurrency": 2,
        **extra,
    }


def count_studies(api: Api) -> tuple[int, int]:
    db = Database(api.settings)
    try:
        with db.session() as session:
            return (
                session.scalar(select(func.count()).select_from(Study)) or 0,
                session.scalar(select(func.count()).select_from(StudyRun)) or 0,
            )
    finally:
        db.dispose()


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"seeds": []}, ["body", "seeds"]),
        ({"seeds": [1, 1]}, ["body", "seeds"]),
        ({"seeds": [0]}, ["body", "seeds"]),  # one seed: no interval, so no verdict
        ({"baseline": "ppo"}, ["body", "baseline"]),
        ({"arms": [{"name": "a"}, {"name": "a"}]}, ["body", "arms"]),
        ({"arms": []}, ["body"]),
        (
            {"arms": [{"name": "a", "overrides": {"params.nope": 1}}], "baseline": None},
            ["body", "arms", 0, "overrides", "params.nope"],
        ),
        (
            {"arms": [{"name": "a", "overrides": {"optim": {"lrr": 1}}}], "baseline": None},
            ["body", "arms", 0, "overrides", "optim", "lrr"],
        ),
        ({"arms": [{"name": "has space"}], "baseline": None}, ["body", "arms", 0, "name"]),
        ({"objective": {"reduce": "best"}}, ["body", "objective", "reduce"]),
        ({"objective": {"metric": "nope/metric"}}, ["body", "objective", "metric"]),
        ({"config": {"steps": -5}}, ["body", "config", "steps"]),
        ({"concurrency": 0}, ["body", "concurrency"]),
    ],
)
def test_bad_study_is_a_422_naming_the_field_and_stores_nothing(
    api: Api, change: dict[str, Any], loc: list[Any]
) -> None:
    before = count_studies(api)
    for path in ("/api/studies/check", "/api/studies"):  # the form's live check says the same
        r = api.post(path, json=study_body(**change))
        assert r.status_code == 422, r.text
        assert any(e["loc"][: len(loc)] == loc for e in r.json()["detail"]), r.json()
    assert count_studies(api) == before


def test_a_base_config_error_is_said_once_on_the_base_config(api: Api) -> None:
    """Not under every arm's overrides (the arms did not cause it); an arm's own error still
    names the arm."""
    body = study_body(config={**tiny_config(2), "steps": -5, "task": {"name": "nope"}})
    body["arms"][1]["overrides"]["params.nope"] = 1
    detail = api.post("/api/studies/check", json=body).json()["detail"]
    locs = [tuple(e["loc"]) for e in detail]
    assert ("body", "config", "steps") in locs and ("body", "config", "task", "name") in locs
    assert not any(loc[:2] == ("body", "arms") and "steps" in loc for loc in locs), locs
    assert ("body", "arms", 1, "overrides", "params.nope") in locs
    assert len(locs) == len(set(locs))


def test_check_plans_the_runs_and_stores_nothing(api: Api) -> None:
    before = count_studies(api)
    r = api.post("/api/studies/check", json=study_body())
    assert r.status_code == 200, r.text
    plan = r.json()
    budget = {k: plan.pop(k) for k in ("tokens", "seconds", "text")}
    assert plan == {
        "arms": ["grpo", "conspo"],
        "tasks": [],
        "seeds": [0, 1, 2],
        "tuning_seeds": [],
        "runs": 6,
        "tuning_runs": 0,
        "final_runs": 6,
        "baseline": "grpo",
    }
    # the budget: 6 runs of 2 steps × 2 prompts × 4 rollouts × ≤ 6 tokens
    assert budget["tokens"] == 6 * 2 * 2 * 4 * 6 and budget["text"].startswith("6 runs, ≤ 576")
    assert count_studies(api) == before


def run_queued(api: Api, study_id: int) -> list[int]:
    """Run every queued run of the study with the worker's own code, in this process, until
    none is left (each finish releases the next pending runs); returns the order they ran."""
    from worker.tasks import execute_run

    settings = api.settings
    db, jobs = Database(settings), JobQueue(make_celery(settings), settings.queue)
    ran: list[int] = []
    try:
        for _ in range(20):
            view = api.get(f"/api/studies/{study_id}?curves=false").json()
            queued = [r["run_id"] for r in view["runs"] if r["status"] == "queued"]
            active = [r for r in view["runs"] if r["status"] in ("queued", "running")]
            assert len(active) <= view["concurrency"]
            if not queued:
                return ran
            execute_run(db, jobs, settings, queued[0])
            ran.append(queued[0])
    finally:
        db.dispose()
    raise AssertionError("the study never finished")


@pytest.mark.slow
def test_study_two_arms_three_seeds_end_to_end(api: Api) -> None:
    if api.settings.mode == "embedded":  # CI time: tests/ui/test_study_page.py runs this study
        pytest.skip("on SQLite through the Celery worker in tests/ui/test_study_page.py")
    r = api.post("/api/studies", json=study_body())
    assert r.status_code == 201, r.text
    study = r.json()
    sid = study["id"]
    states = [(x["arm"], x["seed"], x["status"]) for x in study["runs"]]
    # seed-major, arms interleaved; the first `concurrency` queued, the rest wait in the study
    assert states[:2] == [("grpo", 0, "queued"), ("conspo", 0, "queued")]
    assert {s for *_, s in states[2:]} == {"pending"}
    assert run_queued(api, sid)
    view = api.get(f"/api/studies/{sid}").json()
    assert view["status"] == "done"
    assert {r["name"] for r in view["runs"]} == {
        f"study-{sid}-{arm}-s{seed}" for arm in ("grpo", "conspo") for seed in (0, 1, 2)
    }
    assert all(r["status"] == "succeeded" and r["objective"] is not None for r in view["runs"])
    arms = {a["name"]: a for a in view["arms"]}
    assert arms["grpo"]["n"] == arms["conspo"]["n"] == 3
    (pair,) = view["pairs"]
    assert pair["arm"] == "conspo" and pair["baseline"] == "grpo" and pair["n"] == 3
    assert pair["seeds"] == [0, 1, 2] and pair["dropped"] == []
    assert view["verdict"][0].startswith("conspo − grpo = ")
    # the objective is the mean of the last 2 evals of each run, and pairs are by seed
    by = {(r["arm"], r["seed"]): r for r in view["runs"]}
    run = by[("conspo", 1)]
    points = api.get(f"/api/runs/{run['run_id']}/metrics?keys=eval/accuracy").json()
    values = points["series"]["eval/accuracy"]["values"][-2:]
    assert run["objective"] == pytest.approx(sum(values) / 2)
    d1 = by[("conspo", 1)]["objective"] - by[("grpo", 1)]["objective"]
    assert pair["d"][1] == pytest.approx(d1)
    curve = view["curves"]["eval/accuracy"]["conspo"]
    assert curve["n"] and max(curve["n"]) == 3 and curve["seeds"] == 3
    # the runs list links them by group
    runs = api.get(f"/api/runs?group_id=study-{sid}").json()
    assert runs["total"] == 6
    # exports
    rows = list(csv.DictReader(io.StringIO(api.get(f"/api/studies/{sid}/objective.csv").text)))
    assert len(rows) == 6 and {r["arm"] for r in rows} == {"grpo", "conspo"}
    html = api.get(f"/api/studies/{sid}/report.html").text
    assert "renderStudy(VIEW" in html and "src=" not in html.split("<body>")[1]
    assert api.get("/api/studies").json()["items"][0]["id"] == sid


def test_cancel_drops_pending_runs_and_cancels_queued_ones(api: Api) -> None:
    sid = api.post("/api/studies", json=study_body(concurrency=1)).json()["id"]
    assert api.post(f"/api/studies/{sid}/cancel", user="bob").status_code == 403
    view = api.post(f"/api/studies/{sid}/cancel").json()
    assert view["status"] == "cancelled"
    assert [r["status"] for r in view["runs"]] == ["cancelled"] * 6
    assert api.get("/api/studies/999999").status_code == 404


def claim(api: Api, run_id: int) -> int:
    """queued → running, as a worker takes it (``lifecycle.claim``); returns the attempt."""
    from backend.runs import lifecycle

    db = Database(api.settings)
    try:
        with db.session() as session:
            run = lifecycle.claim(
                session, run_id, host="test", stale_before=utcnow() - timedelta(hours=1),
                max_attempts=3,
            )  # fmt: skip
            assert run is not None
            return run.attempt
    finally:
        db.dispose()


def finish(api: Api, run_id: int, attempt: int, status: RunStatus) -> list[int]:
    """The worker's end of a run: ``lifecycle.finish``, then its study's ``release_for_run``
    (as ``worker.tasks`` does); returns the runs that released."""
    from backend.runs import lifecycle
    from backend.studies import service

    settings = api.settings
    db, jobs = Database(settings), JobQueue(make_celery(settings), settings.queue)
    try:
        with db.session() as session:
            assert lifecycle.finish(session, run_id, attempt, status)
            return service.release_for_run(session, jobs, run_id)
    finally:
        db.dispose()


def test_the_study_page_cancel_stops_running_runs_and_releases_no_more(api: Api) -> None:
    """Cancel on the study page: the running run is asked to stop, the queued one is
    cancelled, the pending ones dropped; when the worker honours the stop, nothing is
    released."""
    sid = api.post("/api/studies", json=study_body(concurrency=2)).json()["id"]
    running, queued = (r["run_id"] for r in api.get(f"/api/studies/{sid}").json()["runs"][:2])
    attempt = claim(api, running)
    view = api.post(f"/api/studies/{sid}/cancel").json()
    assert view["status"] == "cancelled"
    assert view["counts"] == {"running": 1, "cancelled": 5}
    assert api.get(f"/api/runs/{running}").json()["cancel_requested"]
    assert api.get(f"/api/runs/{queued}").json()["status"] == "cancelled"
    assert finish(api, running, attempt, RunStatus.cancelled) == []
    view = api.get(f"/api/studies/{sid}?curves=false").json()
    assert view["counts"] == {"cancelled": 6} and view["stopped_by"] == []  # its own cancel
    assert [r["run_id"] is None for r in view["runs"]] == [False, False] + [True] * 4


def test_a_run_cancelled_from_the_runs_list_stops_its_study(api: Api) -> None:
    """Issue 49: cancelling a study's runs from the runs list made the study release the next
    ones at once. A cancelled run is not a free slot: the study stops (cancelled, its pending
    rows dropped, nothing released); its other run is left to finish. A run that fails frees
    its slot as before (test_release_is_idempotent_and_keeps_the_limit)."""
    from backend.studies import service

    sid = api.post("/api/studies", json=study_body(concurrency=2)).json()["id"]
    first, second = (r["run_id"] for r in api.get(f"/api/studies/{sid}").json()["runs"][:2])
    attempt = claim(api, first)
    assert api.post(f"/api/runs/{first}/cancel").status_code == 200  # the runs list's Cancel
    assert finish(api, first, attempt, RunStatus.cancelled) == []  # the worker honours it
    view = api.get(f"/api/studies/{sid}?curves=false").json()
    assert view["status"] == "cancelled" and view["stopped_by"] == [first]
    assert view["counts"] == {"cancelled": 5, "queued": 1}
    assert [r["run_id"] for r in view["runs"] if r["run_id"] is not None] == [first, second]
    # a queued run cancelled at once (no worker to release anything): the reapers' pass
    sid = api.post("/api/studies", json=study_body(concurrency=2)).json()["id"]
    first = api.get(f"/api/studies/{sid}").json()["runs"][0]["run_id"]
    assert api.post(f"/api/runs/{first}/cancel").json()["status"] == "cancelled"
    settings = api.settings
    db, jobs = Database(settings), JobQueue(make_celery(settings), settings.queue)
    try:
        with db.session() as session:
            service.release_all(session, jobs)
            assert service.release(session, jobs, sid) == []
    finally:
        db.dispose()
    view = api.get(f"/api/studies/{sid}?curves=false").json()
    assert view["status"] == "cancelled" and view["counts"] == {"cancelled": 5, "queued": 1}


def test_release_is_idempotent_and_keeps_the_limit(api: Api) -> None:
    from backend.runs import lifecycle
    from backend.studies import service

    sid = api.post("/api/studies", json=study_body(concurrency=2)).json()["id"]
    settings = api.settings
    db, jobs = Database(settings), JobQueue(make_celery(settings), settings.queue)
    try:
        with db.session() as session:
            assert service.release(session, jobs, sid) == []  # both slots taken
            assert service.release(session, jobs, sid) == []
        view = api.get(f"/api/studies/{sid}?curves=false").json()
        assert view["counts"] == {"queued": 2, "pending": 4}
        first = view["runs"][0]["run_id"]
        attempt = claim(api, first)
        with db.session() as session:  # a finished run frees one slot, once
            assert lifecycle.fail(session, first, attempt, "out of memory")
            assert len(service.release(session, jobs, sid)) == 1
            assert service.release(session, jobs, sid) == []
    finally:
        db.dispose()
        api.post(f"/api/studies/{sid}/cancel")


def progress_on_every_page(api: Api, sid: int) -> dict[str, Any]:
    """The study's progress as each page reads it, held equal: the studies list
    (``GET /api/studies``), the runs list's study row (``?ids=``, beside its runs from
    ``GET /api/runs?group_id=``) and the study page (``GET /api/studies/{id}``, whose counts
    and rows agree with it too)."""
    newest = {s["id"]: s for s in api.get("/api/studies").json()["items"]}[sid]["progress"]
    (asked,) = api.get(f"/api/studies?ids={sid}").json()["items"]
    view = api.get(f"/api/studies/{sid}?curves=false").json()
    assert newest == asked["progress"] == view["progress"]
    assert view["counts"] == newest["counts"] and len(view["runs"]) == newest["runs"]
    listed = api.get(f"/api/runs?group_id=study-{sid}").json()["items"]
    assert len(listed) == newest["started"]  # the runs released; the others are rows only
    assert sum(r["step"] for r in listed) == newest["steps"]
    return dict(newest)


def test_a_study_counts_the_same_on_every_page(api: Api) -> None:
    """Issue 49: the demo (15 runs, 2 at a time) cancelled read "2 runs · 0/600" on the runs
    list and the studies list, 15 runs on its page: a row cancelled before its release was no
    longer counted. Here 6 runs of 2 steps, 2 released, one of them 1 step in: every page says
    6 runs and 1/12 steps, before and after the study is cancelled (its rows cancelled then)."""
    from backend.models import Run

    sid = api.post("/api/studies", json=study_body(concurrency=2)).json()["id"]
    running = api.get(f"/api/studies/{sid}?curves=false").json()["runs"][0]["run_id"]
    attempt = claim(api, running)
    db = Database(api.settings)
    try:
        with db.session() as session:  # one step done, as the worker's sink writes it
            session.execute(update(Run).where(Run.id == running).values(step=1))
            session.commit()
    finally:
        db.dispose()
    before = progress_on_every_page(api, sid)
    assert before == {
        "runs": 6,
        "started": 2,
        "ended": 0,
        "steps": 1,
        "total_steps": 12,
        "counts": {"running": 1, "queued": 1, "pending": 4},
    }
    api.post(f"/api/studies/{sid}/cancel")
    finish(api, running, attempt, RunStatus.cancelled)  # the worker honours the stop
    after = progress_on_every_page(api, sid)
    assert after == {**before, "ended": 6, "counts": {"cancelled": 6}}
    # the runs list asks only for the studies it shows; a bad id is named
    r = api.get("/api/studies?ids=0")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "ids"], r.text
    assert "study id" in r.json()["detail"][0]["msg"]


@pytest.mark.slow
def test_search_study_through_optuna_storage(api: Api) -> None:
    body = study_body(
        arms=[],
        baseline=None,
        seeds=[0],
        concurrency=2,
        config={**tiny_config(1, eval={"every": 1, "pass_k": 1}), "algorithm": "conspo"},
        search={
            "space": {
                "params.tau": {"type": "float", "low": 0.5, "high": 2.0, "log": True},
                "optim.lr": {"type": "categorical", "choices": [1e-4, 1e-3]},
            },
            "sampler": "random",
            "trials": 3,
        },
    )
    bad = {
        **body,
        "search": {**body["search"], "space": {"optim.nope": {"type": "int", "low": 1, "high": 2}}},
    }
    r = api.post("/api/studies", json=bad)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:4] == [
        "body",
        "search",
        "space",
        "optim.nope",
    ]
    r = api.post("/api/studies", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert run_queued(api, sid)
    view = api.get(f"/api/studies/{sid}").json()
    assert view["status"] == "done"
    trials = view["search"]["trials"]
    assert len(trials) == 3 and all(t["state"] == "complete" for t in trials)
    assert {a["name"] for a in view["arms"]} == {"t0", "t1", "t2"}
    for t in trials:
        arm = next(a for a in view["arms"] if a["name"] == t["arm"])
        assert arm["mean"] == pytest.approx(t["value"])
        assert arm["params"] == pytest.approx(t["params"])
    assert set(view["search"]["importances"]) <= {"params.tau", "optim.lr"}


def test_search_prunes_a_hopeless_trial(api: Api) -> None:
    """MedianPruner on three trials of one seed, their evals written as a worker would: the
    first sets the median, the second is below it at every step and is pruned (its run asked to
    stop, the trial told PRUNED), the third is above it and completes."""
    from backend.models import Metric, Run, RunStatus
    from backend.studies import service

    body = study_body(
        arms=[],
        baseline=None,
        seeds=[0],
        concurrency=1,
        config={**tiny_config(3), "algorithm": "conspo"},
        search={
            "space": {"params.tau": {"type": "float", "low": 0.5, "high": 2.0}},
            "sampler": "random",
            "trials": 3,
            "prune": True,
        },
    )
    sid = api.post("/api/studies", json=body).json()["id"]
    settings = api.settings
    db, jobs = Database(settings), JobQueue(make_celery(settings), settings.queue)

    def trial_run(number: int) -> int:
        view = api.get(f"/api/studies/{sid}?curves=false").json()
        return next(r["run_id"] for r in view["runs"] if r["arm"] == f"t{number}")

    def log(run_id: int, values: list[float], status: RunStatus) -> None:
        with db.session() as session:
            run = session.get(Run, run_id)
            assert run is not None
            run.status = RunStatus.running
            for step, value in enumerate(values, 1):
                session.merge(
                    Metric(run_id=run_id, key="eval/accuracy", step=step, value=value, wall_time=0)
                )
            session.commit()
            service.release(session, jobs, sid)  # reports intermediate values, may prune
            run = session.get(Run, run_id, populate_existing=True)
            assert run is not None
            if status != RunStatus.running:
                run.status = status
                session.commit()
                service.release(session, jobs, sid)  # tells the trial, asks the next

    try:
        log(trial_run(0), [0.6, 0.7, 0.8], RunStatus.succeeded)
        hopeless = trial_run(1)
        log(hopeless, [0.1, 0.1], RunStatus.running)
        with db.session() as session:
            run = session.get(Run, hopeless)
            assert run is not None and run.cancel_requested  # pruned: asked to stop
            run.status = RunStatus.cancelled  # as the worker answers a cancel
            session.commit()
            service.release(session, jobs, sid)
        log(trial_run(2), [0.7, 0.8, 0.9], RunStatus.succeeded)
        view = api.get(f"/api/studies/{sid}").json()
        states = [t["state"] for t in view["search"]["trials"]]
        assert states == ["complete", "pruned", "complete"]
        assert view["status"] == "done"
    finally:
        db.dispose()
        api.post(f"/api/studies/{sid}/cancel")


def test_tasks_cross_seeds_and_pair_by_task_and_seed(api: Api) -> None:
    """Two arms × two tasks × two seeds: runs named by task, differences paired by (task, seed),
    and across tasks the IQM with a stratified bootstrap (values written as a worker would)."""
    from backend.models import Metric, Run, RunStatus

    body = study_body(tasks=["arith", "countdown"], seeds=[0, 1], concurrency=8)
    body["objective"] = {"metric": "eval/accuracy", "reduce": "last"}
    r = api.post("/api/studies/check", json={**body, "tasks": ["arith", "nope"]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "tasks", 1]
    assert api.post("/api/studies/check", json=body).json()["runs"] == 8
    r = api.post("/api/studies", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    # d = conspo − grpo: arith 0.1, 0.2; countdown 0.05, 0.0 → IQM 0.075, mean 0.0875
    values = {
        ("grpo", "arith"): [0.5, 0.6],
        ("grpo", "countdown"): [0.2, 0.3],
        ("conspo", "arith"): [0.6, 0.8],
        ("conspo", "countdown"): [0.25, 0.3],
    }
    db = Database(api.settings)
    try:
        view = api.get(f"/api/studies/{sid}?curves=false").json()
        assert len(view["runs"]) == 8
        with db.session() as session:
            for row in view["runs"]:
                assert row["name"] == f"study-{sid}-{row['arm']}-{row['task']}-s{row['seed']}"
                run = session.get(Run, row["run_id"])
                assert run is not None and run.task == row["task"]
                run.status = RunStatus.succeeded
                value = values[(row["arm"], row["task"])][row["seed"]]
                session.add(
                    Metric(run_id=run.id, key="eval/accuracy", step=1, value=value, wall_time=0)
                )
            session.commit()
        view = api.get(f"/api/studies/{sid}?curves=false").json()
    finally:
        db.dispose()
    pair = view["pairs"][0]
    assert pair["n"] == 4 and pair["mean_d"] == pytest.approx(0.0875)
    assert pair["seeds"] == [["arith", 0], ["arith", 1], ["countdown", 0], ["countdown", 1]]
    across = view["tasks"]["pairs"]["conspo"]
    assert across["tasks"] == {"arith": 2, "countdown": 2}
    assert across["iqm"] == pytest.approx(0.075) and across["mean"] == pytest.approx(0.0875)
    # Within-task resamples: arith's d sum is 0.2, 0.3 or 0.4 (1/4, 1/2, 1/4), countdown's 0,
    # 0.05 or 0.1; the extreme totals 0.2 and 0.5 each have probability 1/16 > 2.5%, so the 95%
    # interval of the mean (total / 4) is exactly [0.05, 0.125].
    assert across["ci_mean"] == pytest.approx([0.05, 0.125])
    assert view["tasks"]["arms"]["grpo"]["iqm"] == pytest.approx((0.3 + 0.5) / 2)
    assert "of 4 (task, seed) pairs" in view["verdict"][0] or "n = 4" in view["verdict"][0]
    assert view["verdict"][1].startswith(
        "conspo − grpo across 2 tasks: IQM of the paired differences = +7.5 points ["
    )
