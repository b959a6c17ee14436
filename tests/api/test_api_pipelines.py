"""Job kinds, chaining, pipelines and the model registry, through the worker's own code.

Each run is executed in this process by ``execute_run`` (as a Celery worker would), on the tiny
models. The SFT → RL pipeline checks that the RL stage starts from the SFT stage's checkpoint:
its step-0 evaluation equals the SFT run's final one (same weights, same eval noise).
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from backend.config import Settings
from tests.api.conftest import TINY
from tests.support import ROOT

pytestmark = pytest.mark.services

EVAL = {"every": 0, "pass_k": 2, "temperature": 1.0}
BASE = {**TINY, "eval": EVAL, "checkpoint": {"every": 0}}


def execute(api: Any, run_id: int) -> dict[str, Any]:
    from backend.db import Database
    from backend.runs.queue import JobQueue, make_celery
    from worker.tasks import execute_run

    settings = api.settings
    db = Database(settings)
    try:
        execute_run(db, JobQueue(make_celery(settings), settings.queue), settings, run_id)
    finally:
        db.dispose()
    return api.get(f"/api/runs/{run_id}").json()


def series(api: Any, run_id: int, *keys: str) -> dict[str, Any]:
    got = api.get(f"/api/runs/{run_id}/metrics?keys={','.join(keys)}").json()["series"]
    return {k: dict(zip(got[k]["steps"], got[k]["values"], strict=True)) for k in keys}


def submit(api: Any, config: dict[str, Any]) -> int:
    r = api.post("/api/runs", json={"config": config})
    assert r.status_code == 201, r.text
    return int(r.json()["runs"][0]["id"])


def test_sft_then_rl_pipeline_starts_rl_from_the_sft_checkpoint(own_api: Any) -> None:
    sft = {
        **BASE,
        "kind": "sft",
        "steps": 3,
        "optim": {"lr": 1e-3},
        "kind_params": {"batch_size": 8},
    }
    rl = {**BASE, "steps": 1}
    made = own_api.post("/api/pipelines", json={"name": "sft-then-rl", "stages": [sft, rl]})
    assert made.status_code == 201, made.text
    pipeline = made.json()
    first = pipeline["stages"][0]["run"]
    assert pipeline["stages"][1]["run"] is None and pipeline["stages"][1]["waiting_for"] == 0
    assert first["pipeline_stage"] == 0
    # what a run trains is its kind: an SFT run has no algorithm, and shows as its kind
    assert (first["kind"], first["algorithm"], first["label"]) == ("sft", None, "sft")
    stages = [(s["kind"], s["algorithm"], s["label"]) for s in pipeline["stages"]]
    assert stages == [("sft", None, "sft"), ("rl", "grpo", "rl · grpo")]
    sft_runs = own_api.get("/api/runs", params={"kind": "sft"}).json()["items"]
    assert [r["id"] for r in sft_runs] == [first["id"]]

    done = execute(own_api, first["id"])
    assert done["status"] == "succeeded", done["error"]
    pipeline = own_api.get(f"/api/pipelines/{pipeline['id']}").json()
    second = pipeline["stages"][1]["run"]
    assert second is not None and second["status"] == "queued"
    assert second["config"]["model"]["from_run"] == first["id"]

    done = execute(own_api, second["id"])
    assert done["status"] == "succeeded", done["error"]
    keys = ("eval/accuracy", "eval/pass@k")
    sft_eval, rl_eval = series(own_api, first["id"], *keys), series(own_api, second["id"], *keys)
    for key in keys:
        assert rl_eval[key][0] == sft_eval[key][3], key  # RL step 0 == SFT's final eval
    assert series(own_api, first["id"], "sft/token_acc")["sft/token_acc"].keys() == {1, 2, 3}
    pipeline = own_api.get(f"/api/pipelines/{pipeline['id']}").json()
    assert pipeline["status"] == "succeeded"
    handed, started = pipeline["stages"][0]["eval"]["end"], pipeline["stages"][1]["eval"]["start"]
    assert (handed["step"], started["step"]) == (3, 0)
    assert started["values"]["eval/accuracy"] == handed["values"]["eval/accuracy"]

    models = own_api.get("/api/models").json()["models"]
    rl_model = next(m for m in models if m["run_id"] == second["id"])
    assert rl_model["lineage"][0] == {"run": first["id"], "step": "last", "exists": True}
    assert rl_model["lineage"][-1] == {"base": "tiny"}
    assert "eval/accuracy" in rl_model["eval"]


def test_a_stage_that_did_not_evaluate_its_start_has_no_start_eval(own_api: Any) -> None:
    # SmolLM2's recipe turns eval.at_start off (issue 49's walk): the later stage's first
    # evaluation is after it trained, and calling it the stage's start set the GRPO stage's
    # final eval beside the SFT's as a hand-off that "agreed".
    sft = {**BASE, "kind": "sft", "steps": 1, "kind_params": {"batch_size": 4}}
    rl = {**BASE, "steps": 1, "eval": {**EVAL, "at_start": False}}
    made = own_api.post("/api/pipelines", json={"name": "no-start", "stages": [sft, rl]})
    assert made.status_code == 201, made.text
    pipeline_id = made.json()["id"]
    assert execute(own_api, made.json()["stages"][0]["run"]["id"])["status"] == "succeeded"
    second = own_api.get(f"/api/pipelines/{pipeline_id}").json()["stages"][1]["run"]
    assert execute(own_api, second["id"])["status"] == "succeeded"
    first_stage, second_stage = own_api.get(f"/api/pipelines/{pipeline_id}").json()["stages"]
    assert first_stage["eval"]["start"]["step"] == 0  # at_start on (the default)
    assert second_stage["eval"]["start"] is None
    assert second_stage["eval"]["end"]["step"] == 1


def test_a_failed_stage_stops_the_pipeline(own_api: Any, own_settings: Settings) -> None:
    datasets = own_settings.data_dir / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    (datasets / "empty.jsonl").write_text("")  # passes the submit check, holds no problems
    broken = {**BASE, "kind": "sft", "steps": 1, "kind_params": {"path": "empty.jsonl"}}
    made = own_api.post("/api/pipelines", json={"name": "broken", "stages": [broken, BASE]})
    assert made.status_code == 201, made.text
    run = execute(own_api, made.json()["stages"][0]["run"]["id"])
    assert run["status"] == "failed"
    pipeline = own_api.get(f"/api/pipelines/{made.json()['id']}").json()
    assert pipeline["status"] == "failed" and pipeline["stages"][1]["run"] is None


def test_chat_sft_on_a_dataset_then_dpo_and_distill(own_api: Any, own_settings: Settings) -> None:
    from transformers import AutoModelForCausalLM

    datasets = own_settings.data_dir / "datasets"
    datasets.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "data" / "math" / "easy.jsonl", datasets / "easy.jsonl")
    chat = {
        **BASE,
        "task": {"name": "math", "params": {"path": "easy.jsonl"}, "eval_size": 4},
        "model": {"name": "tiny-chat", "lora": {"rank": 4}},
        "prompt": {"template": "boxed", "chat_template": "on"},
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
        "eval": {**EVAL, "at_start": False},
    }
    sft_params = {"path": "easy.jsonl", "target": "\\boxed{{{answer}}}", "packing": True}
    sft = execute(
        own_api, submit(own_api, {**chat, "kind": "sft", "steps": 2, "kind_params": sft_params})
    )
    assert sft["status"] == "succeeded", sft["error"]

    # the LoRA run exports merged, and the directory loads with from_pretrained
    exported = own_api.post(f"/api/models/{sft['id']}/export", json={"step": "last"})
    assert exported.status_code == 200, exported.text
    model = AutoModelForCausalLM.from_pretrained(exported.json()["path"])
    assert not hasattr(model, "peft_config")

    # an RL run from the SFT model (LoRA merged, fresh adapters), then DPO on its rollouts
    rl = execute(
        own_api,
        submit(own_api, {**chat, "steps": 2, "model": {**chat["model"], "from_run": sft["id"]}}),
    )
    assert rl["status"] == "succeeded", rl["error"]
    dpo_config = {
        **chat,
        "kind": "dpo",
        "steps": 2,
        "kind_params": {"from_run": rl["id"], "batch_size": 2},
    }
    dpo = execute(own_api, submit(own_api, dpo_config))
    pairs = own_settings.run_dir(dpo["id"]) / "dpo_pairs.jsonl"
    if dpo["status"] == "failed":  # no prompt held both outcomes in the sample: said so
        assert "no preference pairs" in dpo["error"]
        assert pairs.read_text() == ""
    else:
        assert pairs.read_text().count("\n") >= 1
        assert series(own_api, dpo["id"], "dpo/accuracy")["dpo/accuracy"].keys() == {1, 2}

    distill_config = {
        **chat,
        "kind": "distill",
        "steps": 2,
        "kind_params": {"teacher": "tiny-chat"},
        "model": {**chat["model"], "from_run": sft["id"]},
    }
    distill = execute(own_api, submit(own_api, distill_config))
    assert distill["status"] == "succeeded", distill["error"]
    kl = series(own_api, distill["id"], "distill/reverse_kl")["distill/reverse_kl"]
    assert kl.keys() == {1, 2} and kl[1] > 0  # the student (SFT) differs from the teacher


def test_chaining_is_validated_at_submit(own_api: Any) -> None:
    def loc_of(r: Any) -> list[list[Any]]:
        assert r.status_code == 422, r.text
        return [e["loc"] for e in r.json()["detail"]]

    missing = {**BASE, "model": {"name": "tiny", "from_run": 999_999}}
    assert ["body", "config", "model", "from_run"] in loc_of(
        own_api.post("/api/runs", json={"config": missing})
    )
    queued = submit(own_api, BASE)  # never run: not finished
    waiting = {**BASE, "model": {"name": "tiny", "from_run": queued}}
    r = own_api.post("/api/runs", json={"config": waiting})
    assert ["body", "config", "model", "from_run"] in loc_of(r)
    assert "has not finished" in r.text
    dpo = {**BASE, "kind": "dpo", "kind_params": {"from_run": queued}}
    assert ["body", "config", "kind_params", "from_run"] in loc_of(
        own_api.post("/api/runs", json={"config": dpo})
    )
    assert ["body", "config", "kind"] in loc_of(
        own_api.post("/api/runs", json={"config": {**BASE, "kind": "ppo"}})
    )
    assert ["body", "config", "kind_params"] in loc_of(
        own_api.post("/api/runs", json={"config": {**BASE, "kind": "dpo"}})
    )
    implicit = {**BASE, "model": {"name": "tiny", "from_run": queued}}
    r = own_api.post("/api/pipelines", json={"name": "p", "stages": [BASE, implicit]})
    assert ["body", "stages", 1, "model", "from_run"] in loc_of(r)


def loc_of(r: Any) -> list[list[Any]]:
    assert r.status_code == 422, r.text
    return [e["loc"] for e in r.json()["detail"]]


def test_a_clone_starting_from_an_unfinished_run_is_refused_at_the_field(api: Any) -> None:
    queued = submit(api, BASE)  # never run: not finished
    r = api.post(f"/api/runs/{queued}/clone", json={"overrides": {"model": {"from_run": queued}}})
    assert ["body", "overrides", "model", "from_run"] in loc_of(r)
    assert "has not finished" in r.text
    r = api.post(f"/api/runs/{queued}/clone", json={"overrides": {"model": {"from_run": 999_999}}})
    assert "run 999999 does not exist" in r.text


def test_job_dataset_paths_are_checked_against_the_data_roots(api: Any) -> None:
    before = api.get("/api/runs?limit=500").json()["total"]
    sft = {**BASE, "kind": "sft", "kind_params": {"path": "nowhere/missing.jsonl"}}
    r = api.post("/api/runs", json={"config": sft})
    assert ["body", "config", "kind_params", "path"] in loc_of(r)
    assert "missing.jsonl" in r.text
    dpo = {**BASE, "kind": "dpo", "kind_params": {"path": "../../etc/passwd"}}
    assert ["body", "config", "kind_params", "path"] in loc_of(
        api.post("/api/runs", json={"config": dpo})
    )
    r = api.post("/api/pipelines", json={"name": "p", "stages": [sft, BASE]})
    assert ["body", "stages", 0, "kind_params", "path"] in loc_of(r)
    assert api.get("/api/runs?limit=500").json()["total"] == before  # nothing half-written


def test_cancelling_a_pipeline_stops_its_stage_and_never_releases_the_rest(api: Any) -> None:
    from backend.db import Database
    from backend.models import Pipeline
    from backend.pipelines import service as pipelines
    from backend.pipelines import stages

    def make() -> dict[str, Any]:
        made = api.post("/api/pipelines", json={"name": "c", "stages": [BASE, BASE, BASE]})
        assert made.status_code == 201, made.text
        return dict(made.json())

    def succeed(session: Any, run_id: int) -> int | None:
        """What a worker's finish does: the run succeeds and releases the next stage, at once."""
        from sqlalchemy import update

        from backend.models import Run

        session.execute(update(Run).where(Run.id == run_id).values(status="succeeded"))
        released = stages.release_next_stage(session, run_id)
        session.commit()
        return released

    p = make()
    assert api.post(f"/api/pipelines/{p['id']}/cancel", user="bob").status_code == 403
    done = api.post(f"/api/pipelines/{p['id']}/cancel").json()
    assert done["status"] == "cancelled"
    assert done["stages"][0]["run"]["status"] == "cancelled"
    assert [s["skipped"] for s in done["stages"]] == [False, True, True]

    db = Database(api.settings)
    try:
        # the stage finishes successfully after the cancel: nothing more is released
        p = make()
        first = p["stages"][0]["run"]["id"]
        with db.session() as session:
            pipelines.cancel_pipeline(session, session.get(Pipeline, p["id"]))
            assert succeed(session, first) is None
        shown = api.get(f"/api/pipelines/{p['id']}").json()
        assert shown["status"] == "cancelled" and shown["stages"][1]["run"] is None

        # the release won the race: the cancel finds the released run and cancels it
        p = make()
        first = p["stages"][0]["run"]["id"]
        with db.session() as session:
            second = succeed(session, first)
            assert second is not None
        shown = api.post(f"/api/pipelines/{p['id']}/cancel").json()
        assert shown["stages"][1]["run"]["id"] == second
        assert shown["stages"][1]["run"]["status"] == "cancelled"
        assert shown["status"] == "cancelled" and shown["stages"][2]["skipped"]
    finally:
        db.dispose()
