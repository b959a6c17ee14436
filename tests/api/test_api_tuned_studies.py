"""Tuned studies through the API: each tuned arm searched on the tuning seeds (Optuna, in the
platform's database), then the arm study on the final seeds at each arm's pick. Validation
(422 naming the field, nothing stored), the budget and its cap, cancel and carrying on from the
database mid-tuning, and a small study end to end (run by the worker's own code)."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from backend.db import Database
from backend.models import RunStatus
from backend.runs.queue import JobQueue, make_celery
from tests.api.conftest import Api, tiny_config
from tests.api.test_api_studies import claim, count_studies, study_body

pytestmark = pytest.mark.services

LR = {"type": "categorical", "choices": [1e-4, 1e-3]}


def tuned_body(**extra: Any) -> dict[str, Any]:
    """GRPO and ConSPO, each searched over two learning rates (ConSPO's τ too) on seed 100,
    then compared on seeds 0 and 1."""
    base = {
        "config": tiny_config(2, eval={"every": 1, "pass_k": 1}),
        "arms": [
            {
                "name": "grpo",
                "overrides": {"algorithm": "grpo"},
                "tune": {"space": {"optim.lr": LR}, "sampler": "grid", "trials": 2},
            },
            {
                "name": "conspo",
                "overrides": {"algorithm": "conspo"},
                "tune": {
                    "space": {
                        "optim.lr": LR,
                        "params.tau": {"type": "float", "low": 0.5, "high": 2.0, "log": True},
                    },
                    "sampler": "random",
                    "trials": 2,
                },
            },
        ],
        "tuning_seeds": [100],
        "seeds": [0, 1],
    }
    return study_body(**{**base, **extra})


def study_runs(view: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run of both phases: the tuning runs (``tuning``), then the final ones (``runs``)."""
    tuning = [r for a in view["tuning"]["arms"] for t in a["trials"] for r in t["runs"]]
    return [*tuning, *view["runs"]]


def run_queued(api: Api, study_id: int) -> list[int]:
    """Run every queued run of the study, tuning and final, with the worker's own code in this
    process until none is left (each finish releases the next); returns the order they ran
    (``test_api_studies.run_queued``, over both phases)."""
    from worker.tasks import execute_run

    settings = api.settings
    db, jobs = Database(settings), JobQueue(make_celery(settings), settings.queue)
    ran: list[int] = []
    try:
        for _ in range(20):
            view = api.get(f"/api/studies/{study_id}?curves=false").json()
            runs = study_runs(view)
            active = [r for r in runs if r["status"] in ("queued", "running")]
            assert len(active) <= view["concurrency"]
            queued = [r["run_id"] for r in runs if r["status"] == "queued"]
            if not queued:
                return ran
            execute_run(db, jobs, settings, queued[0])
            ran.append(queued[0])
    finally:
        db.dispose()
    raise AssertionError("the study never finished")


def with_arm(body: dict[str, Any], i: int, **change: Any) -> dict[str, Any]:
    arms = [dict(a) for a in body["arms"]]
    arms[i] = {**arms[i], **change}
    return {**body, "arms": arms}


def many_trials(trials: int, tuning_seeds: list[int]) -> dict[str, Any]:
    body = tuned_body(tuning_seeds=tuning_seeds)
    for i in (0, 1):
        body = with_arm(body, i, tune={"space": {"optim.lr": LR}, "trials": trials})
    return body


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (tuned_body(tuning_seeds=[100, 1]), ["body", "tuning_seeds"]),  # 1 is a final seed
        (tuned_body(tuning_seeds=[]), ["body", "tuning_seeds"]),  # tune, but no seeds for it
        (tuned_body(tuning_seeds=[100, 100]), ["body", "tuning_seeds"]),
        (tuned_body(tasks=["arith", "countdown"]), ["body", "tasks"]),
        # 2 arms × 200 trials × 3 tuning seeds + 4 final runs: past MAX_RUNS (1000)
        (many_trials(200, [100, 101, 102]), ["body", "arms"]),
        # 2 arms × 60 trials × 2 tuning seeds + 4 = 244 runs: past the operator's cap (200)
        (many_trials(60, [100, 101]), ["body", "arms"]),
    ],
)
def test_bad_tuned_study_is_a_422_naming_the_field(
    api: Api, body: dict[str, Any], loc: list[Any]
) -> None:
    before = count_studies(api)
    for path in ("/api/studies/check", "/api/studies"):
        r = api.post(path, json=body)
        assert r.status_code == 422, r.text
        assert any(e["loc"][: len(loc)] == loc for e in r.json()["detail"]), r.json()
    assert count_studies(api) == before


def test_a_tune_space_is_checked_as_a_search_space_at_its_arm(api: Api) -> None:
    """An unknown path, and a value the arm's config refuses, are 422s at
    body.arms.<i>.tune.space.<path>; tuning seeds with no tuned arm, and a search beside tuned
    arms, at their own fields."""
    bad = {"optim.nope": {"type": "float", "low": 0.1, "high": 1.0}}
    body = with_arm(tuned_body(), 1, tune={"space": bad, "trials": 2})
    r = api.post("/api/studies/check", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "arms", 1, "tune", "space", "optim.nope"]
    negative = {"optim.lr": {"type": "float", "low": -1.0, "high": 1e-3}}
    body = with_arm(tuned_body(), 0, tune={"space": negative, "trials": 2})
    r = api.post("/api/studies/check", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "arms", 0, "tune", "space", "optim.lr"]
    r = api.post("/api/studies/check", json=study_body(tuning_seeds=[7]))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "tuning_seeds"]
    search = {"space": {"optim.lr": LR}, "trials": 2}
    r = api.post("/api/studies/check", json=tuned_body(search=search))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "search"], r.text


def test_check_gives_the_budget_of_both_phases(api: Api) -> None:
    before = count_studies(api)
    plan = api.post("/api/studies/check", json=tuned_body()).json()
    assert plan["tuning_runs"] == 4 and plan["final_runs"] == 4 and plan["runs"] == 8
    assert plan["tuning_seeds"] == [100] and plan["arms"] == ["grpo", "conspo"]
    s = tiny_config(2)["sampling"]  # every run of the study has the tiny model's shape
    per_run = 2 * s["prompts_per_step"] * s["group_size"] * s["max_new_tokens"]
    assert plan["tokens"] == 8 * per_run
    assert "4 tuning + 4 final" in plan["text"]
    assert count_studies(api) == before


def test_a_study_over_the_token_cap_is_refused_at_its_steps(api: Api) -> None:
    """2 arms × 2 seeds of 10⁶ steps × 64 prompts × 16 rollouts × ≤ 512 tokens: past the
    operator's 2·10⁹ tokens a study (CONSPO_STUDY_MAX_TOKENS), said at the field to change."""
    config = {
        **tiny_config(10**6),
        "sampling": {"prompts_per_step": 64, "group_size": 16, "max_new_tokens": 512},
    }
    r = api.post("/api/studies/check", json=study_body(config=config, seeds=[0, 1]))
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "config", "steps"] and "CONSPO_STUDY_MAX_TOKENS" in error["msg"]


def test_cancel_mid_tuning_cancels_its_runs_and_a_restart_carries_on(api: Api) -> None:
    """A run of the tuning phase finishing while no worker releases anything (a server down)
    is picked up by the reapers' pass (``release_all``): the next trial is asked from what the
    database holds. The study's cancel then stops its queued tuning runs."""
    from backend.runs import lifecycle
    from backend.studies import search, service
    from backend.studies.spec import Tune

    body = tuned_body(concurrency=1)
    r = api.post("/api/studies", json=body)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    view = api.get(f"/api/studies/{sid}?curves=false").json()
    assert view["runs"] == [] and view["tuning"]["phase"] == "tuning"
    assert view["tuning"]["planned"] == {"tuning_runs": 4, "final_runs": 4}
    (first,) = [r for a in view["tuning"]["arms"] for t in a["trials"] for r in t["runs"]]
    assert first["seed"] == 100 and first["status"] == "queued"
    attempt = claim(api, first["run_id"])
    settings = api.settings
    db, jobs = Database(settings), JobQueue(make_celery(settings), settings.queue)
    try:
        with db.session() as session:  # the worker dies after finishing: nothing released
            assert lifecycle.finish(session, first["run_id"], attempt, RunStatus.succeeded)
            # and a pass died between asking grpo's next trial and committing its rows
            storage = search.storage(session.get_bind().url.render_as_string(False))
            name = search.optuna_name(sid, "grpo")
            grid = search.sampler(Tune.model_validate(body["arms"][0]["tune"]))
            search._optuna().load_study(study_name=name, storage=storage, sampler=grid).ask()
        with db.session() as session:  # a new server's reaper pass
            released = service.release_all(session, jobs)
    finally:
        db.dispose()
    view = api.get(f"/api/studies/{sid}?curves=false").json()
    runs = study_runs(view)
    (queued,) = [r["run_id"] for r in runs if r["status"] == "queued"]
    assert queued in released  # (other tests' studies may have released runs too)
    assert len(runs) == 2 and {r["seed"] for r in runs} == {100}
    grpo, conspo = view["tuning"]["arms"]
    assert [t["state"] for t in grpo["trials"]][1:] == ["fail"]  # the rowless trial
    assert [len(t["runs"]) for t in conspo["trials"]] == [1]  # the next arm's first trial
    view = api.post(f"/api/studies/{sid}/cancel").json()
    assert view["status"] == "cancelled"
    assert api.get(f"/api/runs/{queued}").json()["status"] == "cancelled"
    db = Database(settings)
    try:
        with db.session() as session:
            assert service.release(session, jobs, sid) == []
    finally:
        db.dispose()


@pytest.mark.slow
def test_tuned_study_end_to_end(api: Api) -> None:
    """2 arms × 2 trials on tuning seed 100, then 2 arms × seeds 0 and 1 at the picks: the
    tuning runs ran on the tuning seed only, each final run has its arm's picked parameters,
    the verdict pairs the final runs alone, and the page, the CSV and the report show both."""
    r = api.post("/api/studies", json=tuned_body(concurrency=2))
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert len(run_queued(api, sid)) == 8
    view = api.get(f"/api/studies/{sid}").json()
    assert view["status"] == "done" and view["tuning"]["phase"] == "final"
    tuning = {a["arm"]: a for a in view["tuning"]["arms"]}
    for name, arm in tuning.items():
        assert len(arm["trials"]) == 2, arm
        for trial in arm["trials"]:
            assert [r["seed"] for r in trial["runs"]] == [100]
            (run,) = trial["runs"]
            config = api.get(f"/api/runs/{run['run_id']}").json()["config"]
            assert config["seed"] == 100 and config["optim"]["lr"] == trial["params"]["optim.lr"]
            assert config["algorithm"] == name
        pick = arm["pick"]
        best = max((t for t in arm["trials"] if t["state"] == "complete"), key=lambda t: t["value"])
        assert pick["trial"] == best["number"] and pick["params"] == best["params"]
        assert pick["value"] == pytest.approx(best["value"]) and pick["confidence"]
    assert tuning["grpo"]["params"] == ["optim.lr"]
    # each trial draws its own: the grid's two values, two distinct random τ
    assert {t["params"]["optim.lr"] for t in tuning["grpo"]["trials"]} == {1e-4, 1e-3}
    assert len({t["params"]["params.tau"] for t in tuning["conspo"]["trials"]}) == 2
    # the final runs: seeds 0 and 1 only, at each arm's pick over its own overrides
    assert {(r["arm"], r["seed"]) for r in view["runs"]} == {
        (arm, seed) for arm in ("grpo", "conspo") for seed in (0, 1)
    }
    for row in view["runs"]:
        config = api.get(f"/api/runs/{row['run_id']}").json()["config"]
        pick = tuning[row["arm"]]["pick"]["params"]
        assert config["optim"]["lr"] == pick["optim.lr"] and config["algorithm"] == row["arm"]
        if row["arm"] == "conspo":
            assert config["params"]["tau"] == pytest.approx(pick["params.tau"])
    arms = {a["name"]: a for a in view["arms"]}
    assert arms["grpo"]["n"] == arms["conspo"]["n"] == 2  # the verdict's: final runs only
    assert arms["conspo"]["params"] == tuning["conspo"]["pick"]["params"]
    (pair,) = view["pairs"]
    assert pair["n"] == 2 and pair["seeds"] == [0, 1]
    assert view["verdict"][0].startswith("conspo − grpo = ")
    assert view["progress"]["runs"] == 8  # both phases counted
    rows = list(csv.DictReader(io.StringIO(api.get(f"/api/studies/{sid}/objective.csv").text)))
    assert [r["phase"] for r in rows] == ["tuning"] * 4 + ["final"] * 4
    assert {r["seed"] for r in rows if r["phase"] == "tuning"} == {"100"}
    assert {(r["arm"], r["trial"]) for r in rows if r["phase"] == "final"} == {
        (arm, str(tuning[arm]["pick"]["trial"])) for arm in ("grpo", "conspo")
    }
    # its runs now time the next such study: from their pace (with a token only)
    plan = api.post("/api/studies/check", json=tuned_body()).json()
    assert plan["seconds"] > 0 and "earlier runs of the same model and shape" in plan["text"]
    assert api.post("/api/studies/check", json=tuned_body(), user=None).json()["seconds"] is None
    html = api.get(f"/api/studies/{sid}/report.html").text
    assert '"tuning": {"phase": "final"' in html and "tuningSection(view)" in html
