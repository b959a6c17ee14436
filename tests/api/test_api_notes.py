"""Notes and tags after submit: PATCH /api/runs/{id} (note, tags), /api/studies/{id} and
/api/pipelines/{id} (note). The owner or an admin; Markdown rendered with raw HTML escaped; bad
input a 422 at the field, nothing half-written."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import Api, tiny_config

pytestmark = pytest.mark.services

HOSTILE_NOTE = (
    "# Why\n\nτ = 5 beat **GRPO** on chain_sum. <script>alert(1)</script>\n"
    '<img src=x onerror="alert(2)"> [bad](javascript:alert(3)) [paper](https://arxiv.org/abs/2605.12969)\n'
)


def run_of(api: Api, **extra: Any) -> dict[str, Any]:
    return api.external(name="noted", tags=["before"], **extra)


def test_the_owner_sets_a_note_and_tags_and_every_view_shows_them(api: Api) -> None:
    run = run_of(api)
    r = api.patch(
        f"/api/runs/{run['id']}", json={"note": HOSTILE_NOTE, "tags": ["best", "τ5", "best"]}
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["note"] == HOSTILE_NOTE and out["tags"] == ["best", "τ5"]
    html = out["note_html"]
    assert "<h1>Why</h1>" in html and "<strong>GRPO</strong>" in html
    assert "<script>" not in html and "&lt;script&gt;" in html  # raw HTML shown as text
    assert "<img" not in html and "javascript:" not in html.split("<a ")[-1].split(">")[0]
    assert 'href="https://arxiv.org/abs/2605.12969" rel="nofollow noopener noreferrer"' in html
    read = api.get(f"/api/runs/{run['id']}").json()
    assert (
        read["note"] == HOSTILE_NOTE
        and read["note_html"] == html
        and read["tags"] == ["best", "τ5"]
    )
    listed = api.get("/api/runs", params={"tag": "τ5"}).json()["items"]
    assert [(r["id"], r["note"]) for r in listed] == [(run["id"], HOSTILE_NOTE)]
    before = api.get("/api/runs", params={"tag": "before"}).json()["items"]
    assert run["id"] not in {r["id"] for r in before}  # the tags were replaced
    # tags alone leave the note; "" clears it
    r = api.patch(f"/api/runs/{run['id']}", json={"tags": []})
    assert r.json()["note"] == HOSTILE_NOTE and r.json()["tags"] == []
    r = api.patch(f"/api/runs/{run['id']}", json={"note": ""})
    assert r.json()["note"] == "" and r.json()["note_html"] == ""


def test_only_the_owner_or_an_admin_may_annotate(api: Api) -> None:
    run = run_of(api)
    assert api.patch(f"/api/runs/{run['id']}", user="bob", json={"note": "mine"}).status_code == 403
    assert api.patch(f"/api/runs/{run['id']}", user=None, json={"note": "mine"}).status_code == 401
    assert api.get(f"/api/runs/{run['id']}").json()["note"] == ""
    assert (
        api.patch(f"/api/runs/{run['id']}", user="root", json={"note": "admin"}).status_code == 200
    )
    assert api.patch("/api/runs/999999", json={"note": "x"}).status_code == 404


BAD = [
    ({}, ["body"], "give note, tags, model_shared or several of them"),
    ({"note": "x" * 20_001}, ["body", "note"], "at most 20000"),
    ({"note": "a\x00b"}, ["body", "note"], ""),
    ({"note": 5}, ["body", "note"], ""),
    ({"tags": ["ok", "bad\nline"]}, ["body", "tags", 1], ""),
    ({"tags": ["t"] * 51}, ["body", "tags"], ""),
    ({"tags": "best"}, ["body", "tags"], ""),
    ({"note": "x", "status": "succeeded"}, ["body", "status"], ""),
]


@pytest.mark.parametrize("body,loc,msg", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_a_422_at_the_field_and_changes_nothing(api: Api, body, loc, msg) -> None:
    run = run_of(api)
    api.patch(f"/api/runs/{run['id']}", json={"note": "kept", "tags": ["kept"]})
    r = api.patch(f"/api/runs/{run['id']}", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(e["loc"][: len(loc)] == loc for e in detail), detail
    assert msg in " ".join(e["msg"] for e in detail)
    after = api.get(f"/api/runs/{run['id']}").json()
    assert after["note"] == "kept" and after["tags"] == ["kept"]


def test_studies_and_pipelines_take_a_note(api: Api) -> None:
    config = tiny_config(2, eval={"every": 1, "pass_k": 1})
    study = api.post("/api/studies", json={
        "name": "noted-study", "config": config, "seeds": [0, 1],
        "arms": [{"name": "grpo", "overrides": {"algorithm": "grpo"}},
                 {"name": "conspo", "overrides": {"algorithm": "conspo"}}],
        "objective": {"metric": "eval/accuracy"}, "concurrency": 1,
    })  # fmt: skip
    assert study.status_code == 201, study.text
    sid = study.json()["id"]
    r = api.patch(f"/api/studies/{sid}", json={"note": "Seeds 0-1 *first*; <b>more</b> later"})
    assert r.status_code == 200, r.text
    assert "<em>first</em>" in r.json()["note_html"] and "&lt;b&gt;" in r.json()["note_html"]
    assert api.get(f"/api/studies/{sid}").json()["note"].startswith("Seeds 0-1")
    listed = {s["id"]: s for s in api.get("/api/studies").json()["items"]}
    assert listed[sid]["note"].startswith("Seeds 0-1")
    assert api.patch(f"/api/studies/{sid}", user="bob", json={"note": "x"}).status_code == 403
    assert api.patch(f"/api/studies/{sid}", json={"note": "x" * 20_001}).status_code == 422
    api.post(f"/api/studies/{sid}/cancel")

    pipeline = api.post("/api/pipelines", json={"name": "noted-pipe", "stages": [config]})
    assert pipeline.status_code == 201, pipeline.text
    pid = pipeline.json()["id"]
    r = api.patch(f"/api/pipelines/{pid}", json={"note": "stage 0 only"})
    assert r.status_code == 200 and r.json()["note_html"] == "<p>stage 0 only</p>\n"
    assert api.get(f"/api/pipelines/{pid}").json()["note"] == "stage 0 only"
    assert api.patch(f"/api/pipelines/{pid}", user="bob", json={"note": "x"}).status_code == 403
    assert api.patch(f"/api/pipelines/{pid}", json={}).status_code == 422
    api.post(f"/api/pipelines/{pid}/cancel")
