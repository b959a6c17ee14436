"""Hostile input on the surfaces added since the first hostile suite (issue 27): prompt
templates, job-kind params (a distillation teacher, an SFT dataset, DPO's run), runs started
from runs, clones, studies (every arm and every value of a search space, the largest trial by
memory, dotted overrides), pipelines, the comparison exports, and the model registry.

Every case, on SQLite and PostgreSQL, gets a 4xx whose ``loc`` names the field, and nothing is
written: no run, study or pipeline row, no export on disk. The cases are ``Case``s as in
``test_api_hostile``; ``{failed}`` is a run that failed, ``{src}`` one to clone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update

from backend.db import Database
from backend.models import Pipeline, Run, RunStatus, Study
from tests.api.conftest import Api, run_in_worker, tiny_config
from tests.api.test_api_hostile import Case

RUNS, CLONE, STUDIES, CHECK, PIPELINES = (
    "/api/runs",
    "/api/runs/{src}/clone",
    "/api/studies",
    "/api/studies/check",
    "/api/pipelines",
)
NOT_DATASETS = "not-a-dataset"  # a directory inside the data roots holding no dataset
GOOD_FILE = "problems.jsonl"


def run(**config: Any) -> dict[str, Any]:
    return {"config": tiny_config(2, **config)}


def distill(teacher: str) -> dict[str, Any]:
    return {"kind": "distill", "kind_params": {"teacher": teacher}}


def study(config: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    body = {"name": "hostile", "config": config or tiny_config(2), "seeds": [0, 1]}
    return {**body, "arms": [{"name": "a", "overrides": {}}], **fields}


def search(space: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    body = study(config, search={"space": space, "sampler": "random", "trials": 2})
    return {k: v for k, v in body.items() if k != "arms"}


def both(body: dict[str, Any], where: str) -> list[Case]:
    """A study case for POST /api/studies and for /api/studies/check alike."""
    return [Case(STUDIES, body, where), Case(CHECK, body, where)]


def categorical(*choices: Any) -> dict[str, Any]:
    return {"type": "categorical", "choices": list(choices)}


JSONL = tiny_config(2, task={"name": "jsonl", "params": {"path": GOOD_FILE}})
HOSTILE_TEMPLATES = ["{question:>1000000000}{question}", "{question.__foo__}", "{question[x]}"]
TEACHERS = ["/etc", "../../..", "https://evil.example/model", "evil/not-allowed"]

CASES = [
    # prompt templates: str.format's specs, attribute and index access
    *[Case(RUNS, run(prompt={"template": t}), "config.prompt.template") for t in HOSTILE_TEMPLATES],
    Case(
        RUNS,
        run(kind="sft", kind_params={"target": "{answer:>1000000000}"}),
        "config.kind_params.target",
    ),
    # (a base config's own error is said once, on the base config, not under each arm)
    *both(study(run(prompt={"template": "{question[x]}"})["config"]),
          "config.prompt.template"),
    # a distillation teacher outside the model roots and the hub allowlist
    *[Case(RUNS, run(**distill(t)), "config.kind_params.teacher") for t in TEACHERS],
    Case(CLONE, {"overrides": distill("/etc")}, "overrides.kind_params.teacher"),
    # an environment's simulator model outside the model roots and the hub allowlist
    *[Case(RUNS, run(task={"name": "environment", "params": {"environment": "ask_the_user"}},
                     environment={"simulator": t}), "config.environment.simulator")
      for t in TEACHERS],
    # PPO's critic model outside the model roots and the hub allowlist
    *[Case(RUNS, run(algorithm="ppo", params={"critic_model": t}), "config.params.critic_model")
      for t in TEACHERS],
    Case(PIPELINES, {"name": "p", "stages": [run(**distill("/etc"))["config"]]},
         "stages.0.kind_params.teacher"),
    *both(
        study(run(**distill("tiny"))["config"],
              arms=[{"name": "a", "overrides": {"kind_params.teacher": "/etc"}}]),
        "arms.0.overrides.kind_params.teacher",
    ),
    # datasets: a directory holding no dataset, a file outside the roots
    Case(RUNS, run(kind="sft", kind_params={"path": NOT_DATASETS}), "config.kind_params.path"),
    Case(PIPELINES, {"name": "p", "stages": [run(kind="sft", kind_params={"path": "/etc"})
                                             ["config"]]}, "stages.0.kind_params.path"),
    # runs started from a run that failed
    Case(RUNS, run(kind="dpo", kind_params={"from_run": "{failed}"}),
         "config.kind_params.from_run"),
    Case(RUNS, run(model={"name": "tiny", "from_run": "{failed}"}), "config.model.from_run"),
    Case(PIPELINES, {"name": "p", "stages": [run(kind="dpo", kind_params={"from_run": "{failed}"})
                                             ["config"]]}, "stages.0.kind_params.from_run"),
    *both(study(arms=[{"name": "a", "overrides": {"model.from_run": "{failed}"}}]),
          "arms.0.overrides.model.from_run"),
    # search spaces: every value is checked, and the largest trial by memory
    *both(search({"model.name": categorical("tiny", "/etc")}), "search.space.model.name"),
    *both(search({"model.name": categorical("evil/not-allowed")}), "search.space.model.name"),
    *both(search({"task.params.path": categorical(GOOD_FILE, "/etc/passwd")}, JSONL),
          "search.space.task.params.path"),
    *both(search({"kind_params.teacher": categorical("tiny", "../../..")},
                 run(**distill("tiny"))["config"]), "search.space.kind_params.teacher"),
    *both(
        search({
            "sampling.prompts_per_step": {"type": "int", "low": 1, "high": 4096},
            "sampling.max_new_tokens": {"type": "int", "low": 1, "high": 32768},
        }),
        "search.space.sampling.prompts_per_step",  # the first parameter in the refused section
    ),
    # dotted overrides hundreds of levels deep
    *both(study(arms=[{"name": "a", "overrides": {"a." * 499 + "a": 1}}]), "arms.0.overrides"),
    *both(search({"a." * 99 + "a": categorical(1)}), "search.space"),
    # a model export needs a body it understands
    Case("/api/models/{src}/export", {"step": "../../etc"}, "step"),
]  # fmt: skip
GET_CASES = [
    # a lone surrogate spelled in UTF-8 (Starlette would hand it over as U+FFFD)
    ("/api/compare/objective.csv?runs={src}&key=%ED%A0%80", ["query", "key"]),
    ("/api/compare/report.html?runs={src}&key=%ED%A0%80", ["query", "key"]),
    ("/api/compare/objective.csv?runs={src}&group=params.%ED%A0%80", ["query", "group"]),
    ("/api/compare/report.html?runs={src}&baseline=%ED%A0%80", ["query", "baseline"]),
    ("/api/runs?q=%ED%A0%80", ["query", "q"]),
    ("/api/compare/objective.csv?runs={src}&group=a%01b", ["query", "group"]),
]


def names_the_field(case: Case, response: Any) -> bool:
    """Some error's loc, dotted (a study's dotted override keys kept whole), starts at
    ``case.where``."""
    where = f"body.{case.where}"
    dotted = [".".join(str(p) for p in e["loc"]) for e in response.json()["detail"]]
    return any(d == where or d.startswith(where + ".") for d in dotted)


def fill(value: Any, ids: dict[str, int]) -> Any:
    """``value`` with every string "{name}" replaced by the run id ``ids[name]``."""
    if isinstance(value, dict):
        return {k: fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, ids) for v in value]
    if isinstance(value, str) and value.startswith("{") and value[1:-1] in ids:
        return ids[value[1:-1]]
    return value


def rows(api: Api) -> tuple[int, ...]:
    db = Database(api.settings)
    try:
        with db.session() as session:
            return tuple(
                session.scalar(select(func.count()).select_from(t)) or 0
                for t in (Run, Study, Pipeline)
            )
    finally:
        db.dispose()


@pytest.fixture(scope="module")
def ids(api: Api) -> Iterator[dict[str, int]]:
    """A run to clone, one that failed, and the data root's files the cases name."""
    root = api.settings.data_roots[0]
    (root / NOT_DATASETS / "sub").mkdir(parents=True, exist_ok=True)
    (root / NOT_DATASETS / "notes.txt").write_text("no dataset here\n")
    (root / GOOD_FILE).write_text('{"prompt": "1+1", "answer": "2"}\n' * 8)
    src, failed = (api.post(RUNS, json=run()).json()["runs"][0]["id"] for _ in range(2))
    db = Database(api.settings)
    with db.session() as session:
        session.execute(update(Run).where(Run.id == failed).values(status=RunStatus.failed))
        session.commit()
    db.dispose()
    yield {"src": src, "failed": failed}


def test_hostile_requests_on_the_new_surfaces_get_a_4xx_naming_the_field(
    api: Api, ids: dict[str, int]
) -> None:
    before = rows(api)
    wrong = []
    for case in CASES:
        r = api.post(case.path.format(**ids), json=fill(case.body, ids))
        if r.status_code != case.status or not names_the_field(case, r):
            wrong.append(f"{case.path} {case.where}: {r.status_code} {r.text[:400]}")
    for path, loc in GET_CASES:
        r = api.get(path.format(**ids))
        if r.status_code != 422 or loc not in [e["loc"] for e in r.json()["detail"]]:
            wrong.append(f"GET {path}: {r.status_code} {r.text[:300]}")
    assert not wrong, "\n".join(wrong)
    assert rows(api) == before, "a refused request wrote a row"
    assert not list((api.settings.data_dir / "exports").glob("*"))


def test_the_estimate_of_a_hostile_template_is_a_short_answer_naming_it(api: Api) -> None:
    """The form's estimate (open to anyone) validates without building the prompt."""
    for template in HOSTILE_TEMPLATES:
        body = {"config": {"steps": 2, "prompt": {"template": template}}}
        r = api.post("/api/runs/estimate", user=None, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["fits"] is None and "prompt.template" in r.json()["text"]


def test_another_users_model_export_is_refused_and_writes_nothing(api: Api) -> None:
    """Exporting writes to the server's disk: only the run's owner (or an admin) may."""
    run = run_in_worker(api, tiny_config(2))
    assert run["status"] == "succeeded", run["error"]
    exports = api.settings.data_dir / "exports"
    r = api.post(f"/api/models/{run['id']}/export", user="bob", json={})
    assert r.status_code == 403 and "only its owner or an admin" in r.json()["detail"]
    assert not list(exports.glob(f"run-{run['id']}-*"))
    r = api.post(f"/api/models/{run['id']}/export", user="alice", json={})
    assert r.status_code == 200, r.text
    assert (Path(r.json()["path"]) / "config.json").is_file()
