"""Per-problem evaluation results through the worker and the API, on SQLite and PostgreSQL:
two runs of one task and seed (GRPO and ConSPO) evaluated at the start and the end, their
problems paired by prompt, filtered, McNemar's p from the same counts, a problem's history;
evaluations thinned evenly past the cap; a deleted run takes its answers along."""

from __future__ import annotations

from typing import Any

import pytest

from backend.api.routes.answers import mcnemar_p
from backend.db import Database
from backend.models import EvalAnswer, Study, StudyRun
from backend.storage import answers as stored
from conspo.sink import AnswerRecord
from tests.api.conftest import Api, run_in_worker, tiny_config


def evaluated(algorithm: str) -> dict[str, Any]:
    return tiny_config(
        2,
        algorithm=algorithm,
        model={"name": "tiny-arith"},
        task={"name": "arith", "eval_size": 8},
        eval={"every": 2, "at_start": True, "pass_k": 2},
    )


@pytest.fixture
def two_runs(own_api: Api) -> tuple[dict[str, Any], dict[str, Any]]:
    grpo = run_in_worker(own_api, evaluated("grpo"))
    conspo = run_in_worker(own_api, evaluated("conspo"))
    assert grpo["status"] == conspo["status"] == "succeeded", (grpo["error"], conspo["error"])
    return grpo, conspo


def test_two_runs_answers_are_stored_paired_and_compared(
    own_api: Api, two_runs: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    api = own_api
    grpo, conspo = two_runs
    one = api.get(f"/api/runs/{grpo['id']}/answers").json()
    assert one["sources"] == {"held_out": [0, 2]} and one["step"] == 2
    answers = one["answers"]
    assert [a["position"] for a in answers] == list(range(8))
    accuracy = api.get(f"/api/runs/{grpo['id']}/metrics?keys=eval/accuracy").json()["series"]
    assert accuracy["eval/accuracy"]["steps"] == [0, 2]
    assert sum(a["solved"] for a in answers) / 8 == pytest.approx(
        accuracy["eval/accuracy"]["values"][-1]
    )
    assert all(a["answer"] is not None and a["prompt"] for a in answers)

    ids = f"{grpo['id']},{conspo['id']}"
    both = api.get(f"/api/answers?runs={ids}&limit=500").json()
    assert both["problems_seen"] == 8 == both["total"]  # one task, one seed: the same split
    by_run = {r["id"]: r for r in both["runs"]}
    assert by_run[grpo["id"]]["step"] == 2 and by_run[grpo["id"]]["evaluations"] == [0, 2]
    solved = {
        rid: {p["key"] for p in both["problems"] if p["answers"][str(rid)]["solved"]}
        for rid in (grpo["id"], conspo["id"])
    }
    (pair,) = both["pairs"]
    assert pair["a_only"] == len(solved[grpo["id"]] - solved[conspo["id"]])
    assert pair["b_only"] == len(solved[conspo["id"]] - solved[grpo["id"]])
    assert pair["both"] == len(solved[grpo["id"]] & solved[conspo["id"]])
    assert pair["shared"] == 8
    assert pair["mcnemar_p"] == pytest.approx(mcnemar_p(pair["a_only"], pair["b_only"]))

    disagree = api.get(f"/api/answers?runs={ids}&show=disagree").json()
    assert disagree["total"] == pair["a_only"] + pair["b_only"]
    wrong = api.get(f"/api/answers?runs={ids}&show=all_wrong").json()
    assert wrong["total"] == pair["neither"]
    only = api.get(f"/api/answers?runs={ids}&show=only&a={grpo['id']}&b={conspo['id']}").json()
    assert {p["key"] for p in only["problems"]} == solved[grpo["id"]] - solved[conspo["id"]]
    first = api.get(f"/api/answers?runs={ids}&step=first&text=true&limit=2").json()
    assert [r["step"] for r in first["runs"]] == [0, 0] and len(first["problems"]) == 2
    shown = first["problems"][0]["answers"][str(grpo["id"])]
    assert "answer" in shown and "reference" in shown
    regressed = api.get(f"/api/answers?runs={ids}&show=regressed").json()
    start = {
        rid: {
            a["problem_key"]
            for a in api.get(f"/api/runs/{rid}/answers?step=0").json()["answers"]
            if a["solved"]
        }
        for rid in (grpo["id"], conspo["id"])
    }
    expected = {k for rid in start for k in start[rid] - solved[rid]}
    assert {p["key"] for p in regressed["problems"]} == expected

    key = answers[0]["problem_key"]
    history = api.get(f"/api/runs/{grpo['id']}/answers/history?problem={key}").json()
    assert [h["step"] for h in history["steps"]] == [0, 2]

    # refusals, each at its parameter
    r = api.get(f"/api/answers?runs={ids}&step=1")
    assert r.status_code == 422 and "has no held_out evaluation at step 1 (it has: 0, 2)" in r.text
    assert api.get("/api/answers?runs=999999").status_code == 404
    r = api.get(f"/api/answers?runs={ids}&show=only&a={grpo['id']}")
    assert r.status_code == 422 and "needs a and b" in r.text
    external = api.external()
    r = api.get(f"/api/answers?runs={grpo['id']},{external['id']}")
    assert r.status_code == 422 and f"run {external['id']} has no stored held_out answers" in r.text

    # a study: ConSPO against its GRPO baseline, one seed
    db = Database(api.settings)
    with db.session() as session:
        study = Study(name="answers", spec={}, baseline="grpo", owner_id=None)
        session.add(study)
        session.flush()
        for i, (arm, run) in enumerate((("grpo", grpo), ("conspo", conspo))):
            session.add(StudyRun(study_id=study.id, arm=arm, seed=0, position=i, state="released",
                                 config={}, run_id=run["id"]))  # fmt: skip
        session.commit()
        study_id = study.id
    verdict = api.get(f"/api/studies/{study_id}/answers").json()
    (arm,) = verdict["arms"]
    assert verdict["baseline"] == "grpo" and arm["arm"] == "conspo"
    assert (arm["solved_alone"], arm["baseline_alone"]) == (pair["b_only"], pair["a_only"])
    assert arm["seeds"][0]["run"] == conspo["id"] and arm["seeds"][0]["baseline_run"] == grpo["id"]

    assert api.delete(f"/api/runs/{grpo['id']}").status_code == 204
    with db.session() as session:
        assert stored.count(session, grpo["id"]) == 0 and stored.count(session, conspo["id"]) == 16
    db.dispose()


def test_evaluations_past_the_cap_are_thinned_evenly(own_api: Api) -> None:
    db = Database(own_api.settings)
    record = AnswerRecord("held_out", 0, "ab", "q", "r", "a", True, -0.5, 2, 1)
    with db.session() as session:
        for step in range(0, 300, 10):  # 30 evaluations
            stored.write_answers(session, 424242, {step: [record]})
        session.commit()
        steps = sorted(s for (s,) in session.query(EvalAnswer.step).filter_by(run_id=424242))
        assert len(steps) == stored.MAX_EVALUATIONS and steps[0] == 0 and steps[-1] == 290
        gaps = {b - a for a, b in zip(steps, steps[1:], strict=False)}
        assert gaps <= {10, 20}  # no hole wider than two evaluations
        stored.write_answers(session, 424242, {290: [record, record]})  # written again: replaced
        session.commit()
        assert stored.count(session, 424242) == stored.MAX_EVALUATIONS
    db.dispose()


def test_mcnemar_exact() -> None:
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(0, 6) == pytest.approx(2 / 64)
    assert mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(1, 9) == pytest.approx(2 * 11 / 1024)
