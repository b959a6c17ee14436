"""Finding runs by config and by results: GET /api/runs?where=… (backend/runs/where.py) on SQLite
and PostgreSQL, against runs with known configs and metrics; and hostile queries, each a 422 at
query.where naming the character, never a 500, never SQL."""

from __future__ import annotations

import uuid

import pytest

from tests.api.conftest import Api


def make_runs(api: Api, marker: str) -> dict[str, int]:
    """Five external runs of known configs and metrics, tagged ``marker``."""
    runs = {
        "conspo-t5-good": ({"algorithm": "conspo", "params": {"tau": 5, "contrast": "exp"},
                            "task": {"params": {"dataset": "chain_sum"}},
                            "model": {"lora": {"rank": 16}, "gradient_checkpointing": True}},
                           {"eval/accuracy": [0.1, 0.3, 0.25], "sep/gap": [-0.1, 0.2, 0.4]}),
        "conspo-t8-poor": ({"algorithm": "conspo", "params": {"tau": 8},
                            "task": {"params": {"dataset": "chain_sum"}},
                            "model": {"lora": {"rank": 0}}},
                           {"eval/accuracy": [0.1, 0.15, 0.12], "sep/gap": [0.3, 0.1, -0.2]}),
        "conspo-t2": ({"algorithm": "conspo", "params": {"tau": 2},
                       "task": {"params": {"dataset": "chain_sum"}}},
                      {"eval/accuracy": [0.5, 0.6, 0.7]}),
        "grpo-good": ({"algorithm": "grpo", "params": {"tau": "5"},  # a string: not a number
                       "task": {"params": {"dataset": "basic_arithmetic"}}},
                      {"eval/accuracy": [0.3, 0.4, 0.45], "sep/gap": [0.0, 0.1, 0.2]}),
        "no-metrics": ({"algorithm": "conspo", "params": {"tau": 6}}, {}),
    }  # fmt: skip
    ids = {}
    for name, (config, metrics) in runs.items():
        out = api.external(name=f"{name}-{marker}", config=config, tags=[marker],
                           algorithm=config["algorithm"])  # fmt: skip
        steps = [
            {"step": s, "metrics": {k: v[s] for k, v in metrics.items()}}
            for s in range(3)
            if metrics
        ]
        if steps:
            r = api.post(f"/api/runs/{out['id']}/log", json={"steps": steps})
            assert r.status_code == 200, r.text
        ids[name] = out["id"]
    return ids


def found(api: Api, marker: str, where: str) -> set[int]:
    r = api.get("/api/runs", params={"tag": marker, "where": where, "limit": 500})
    assert r.status_code == 200, (where, r.text)
    return {run["id"] for run in r.json()["items"]}


@pytest.fixture(scope="module")
def runs(api: Api) -> tuple[str, dict[str, int]]:
    marker = f"where-{uuid.uuid4().hex[:8]}"
    return marker, make_runs(api, marker)


CASES: list[tuple[str, set[str]]] = [
    # the question: ConSPO runs with tau >= 5 whose held-out accuracy beat 0.2
    ("algorithm=conspo AND params.tau>=5 AND best(eval/accuracy)>0.2", {"conspo-t5-good"}),
    ("params.tau>=5", {"conspo-t5-good", "conspo-t8-poor", "no-metrics"}),  # "5" is text
    ("params.tau='5'", {"grpo-good"}),
    ("task.params.dataset=chain_sum", {"conspo-t5-good", "conspo-t8-poor", "conspo-t2"}),
    ("model.lora.rank>0", {"conspo-t5-good"}),
    ("model.gradient_checkpointing=true", {"conspo-t5-good"}),
    ("model.gradient_checkpointing!=true", set()),  # no run has it false; absent never matches
    ("last(sep/gap)>0", {"conspo-t5-good", "grpo-good"}),
    ("max(sep/gap)>0.25", {"conspo-t5-good", "conspo-t8-poor"}),
    ("min(sep/gap)<0", {"conspo-t5-good", "conspo-t8-poor"}),
    ("last(eval/accuracy)>=0.7, params.contrast=exp", set()),
    ("best(eval/accuracy) > 0.4 && algorithm != conspo", {"grpo-good"}),
    ("params.tau<6 and params.tau>2", {"conspo-t5-good"}),
    ("best(eval/gsm8k/pass@4)>0", set()),  # a declared key (a benchmark's) no run has logged
]


@pytest.mark.parametrize("where,want", CASES, ids=[c[0] for c in CASES])
def test_runs_are_found_by_config_and_results(api, runs, where, want):
    marker, ids = runs
    assert found(api, marker, where) == {ids[name] for name in want}


HOSTILE = [
    "params.tau>=5' OR 1=1 --",
    "params.tau>=5; DROP TABLE runs; --",
    "'; DELETE FROM metrics; --=1",
    "best(eval/accuracy') > 0",
    "x=1 OR 1=1",
    "x=1 AND",
    "AND x=1",
    "x==",
    "x=1 x=2",
    "(x=1)",
    "((((((((((x=1))))))))))",
    'x="unterminated',
    "x='unterminated",
    "best(eval/accuracy)>abc",
    "best(eval/accuracy)>true",
    "best()>1",
    "best(eval/accuracy>1",
    "last(a b)>1",
    "x<true",
    "x.=1",
    ".x=1",
    "x..y=1",
    "1x=1",
    "x=1e999",
    "x=nan",  # a word: compares as text, matches nothing (a 200), see below
    "x = -",
    "params.tau >>= 5",
    "params.tau =< 5",
    "params.tau <> 5",
    "params.tau ! 5",
    "ünïcode=1",
    "x=ünïcode",
    "x=\u202eevil",
    "x=\x00",
    "x\x00=1",
    'name = "a\x00b"',
    "x=1\n;DROP",
    "a." + "b." * 20 + "c=1",
    "x=1 AND " * 20 + "y=2",
    "x" * 3000 + "=1",
    "best(" + "k" * 300 + ")>1",
    "$where=1",
    "config->>'a'=1",
    "json_extract(config, '$.a')=1",
    "x=%27",
    '{"a": 1}',
    "[x]=1",
    "x=(select 1)",
    "\\x=1",
    "x=1 ANDx=2",
    "x=1 && && y=2",
]


@pytest.mark.parametrize("where", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_queries_are_a_422_at_the_field_or_match_nothing(api, runs, where):
    marker, _ = runs
    r = api.get("/api/runs", params={"tag": marker, "where": where})
    assert r.status_code in (200, 422), (where, r.status_code, r.text)
    if r.status_code == 200:  # parsed: the text is a value, compared as one
        assert r.json()["items"] == [], where
        return
    detail = r.json()["detail"]
    assert [e["loc"] for e in detail] == [["query", "where"]], detail
    msg = detail[0]["msg"]
    # names the place (a length refusal is FastAPI's own max_length message)
    assert "at character" in msg or "at most" in msg, msg


def test_the_tables_are_untouched_after_the_hostile_queries(api, runs):
    marker, ids = runs
    r = api.get("/api/runs", params={"tag": marker, "limit": 500})
    assert {run["id"] for run in r.json()["items"]} == set(ids.values())
    series = api.get(f"/api/runs/{ids['conspo-t5-good']}/metrics", params={"keys": "sep/gap"})
    assert series.status_code == 200 and series.json()


def test_the_error_points_at_the_character(api):
    r = api.get("/api/runs", params={"where": "params.tau>=5 OR x=1"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["msg"].startswith("at character 15: expected AND")


ORDERS = [
    ("-max(eval/accuracy)", ["conspo-t2", "grpo-good", "conspo-t5-good", "conspo-t8-poor"]),
    ("min(sep/gap)", ["conspo-t8-poor", "conspo-t5-good", "grpo-good"]),
    ("-last(eval/accuracy)", ["conspo-t2", "grpo-good", "conspo-t5-good", "conspo-t8-poor"]),
    # numbers first (ascending), then the run whose tau is text, then the runs without one
    ("params.tau", ["conspo-t2", "conspo-t5-good", "no-metrics", "conspo-t8-poor", "grpo-good"]),
]


@pytest.mark.parametrize("order_by,first", ORDERS, ids=[o[0] for o in ORDERS])
def test_runs_are_ordered_by_a_metric_summary_or_a_config_value(api, runs, order_by, first):
    """order_by: the largest first with '-'; runs without the metric (or a number there) last."""
    marker, ids = runs
    r = api.get("/api/runs", params={"tag": marker, "order_by": order_by, "limit": 500})
    assert r.status_code == 200, r.text
    got = [run["id"] for run in r.json()["items"]]
    assert got[: len(first)] == [ids[name] for name in first], (order_by, got)
    assert len(got) == len(ids)  # the rest still listed, after


def test_a_bad_order_is_a_422_at_the_field(api):
    for bad in ("max(sep/gap", "-", "params.tau desc", "best(x) > 1", "x" * 301):
        r = api.get("/api/runs", params={"order_by": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["detail"][0]["loc"] == ["query", "order_by"]


def test_a_misspelt_config_path_names_the_closest_ones(api, runs):
    """Issue 49: a where key that no config has (params.tua) matched nothing, silently. It is a
    422 at the parameter, at the character, with the closest paths the config defines; a key only
    an external run's free config has is still a key (it is stored)."""
    marker, ids = runs
    for param, text, at, close in [
        ("where", "algorithm=conspo AND params.tua>=5", 22, "params.tau"),
        ("where", "model.lora.rnak>0", 1, "model.lora.rank"),
        ("order_by", "-optim.lrr", 2, "optim.lr"),
    ]:
        r = api.get("/api/runs", params={"tag": marker, param: text})
        assert r.status_code == 422, (text, r.text)
        [error] = r.json()["detail"]
        assert error["loc"] == ["query", param]
        assert error["msg"].startswith(f"at character {at}:") and close in error["msg"], error
    # defined by a registered entry (a task's parameter), by a free-form object, or only stored
    assert found(api, marker, "task.params.dataset=chain_sum")  # defined and stored
    assert found(api, marker, "kind_params.batch_size>100") == set()  # defined (sft), none has it
    assert found(api, marker, "task.params.config.size>1") == set()  # under a free-form object
    ext = api.external(name=f"free-{marker}", config={"learning_rate": 0.1}, tags=[marker])
    assert found(api, marker, "learning_rate>0.05") == {ext["id"]}
    assert api.delete(f"/api/runs/{ext['id']}").status_code == 204


def test_a_misspelt_metric_key_names_the_closest_ones(api, runs):
    """Issue 49: best(eval/acuracy) matched nothing, silently. A key that the catalogue does not
    declare and no run has stored is a 422 at the parameter, at the key's character, with the
    closest known keys (declared, or logged by a recent run); a key only an external run logged
    is still a key (it is stored)."""
    marker, ids = runs
    ext = api.external(name=f"own-key-{marker}", config={}, tags=[marker])
    steps = [{"step": 1, "metrics": {"train/my_reward": 1.5}}]
    logged = api.post(f"/api/runs/{ext['id']}/log", json={"steps": steps})
    assert logged.status_code == 200, logged.text
    for param, text, at, close in [
        ("where", "algorithm=conspo AND best(eval/acuracy)>0.2", 27, "eval/accuracy"),
        ("where", "params.tau>0, max(sep/gpa)>0", 19, "sep/gap"),
        ("where", "max(train/my_rewrd)>1", 5, "train/my_reward"),  # a stored key, not declared
        ("order_by", "-last(eval/acuracy)", 7, "eval/accuracy"),
    ]:
        r = api.get("/api/runs", params={"tag": marker, param: text})
        assert r.status_code == 422, (text, r.text)
        [error] = r.json()["detail"]
        assert error["loc"] == ["query", param]
        assert error["msg"].startswith(f"at character {at}:") and close in error["msg"], error
    assert found(api, marker, "max(train/my_reward)>1") == {ext["id"]}
    r = api.get("/api/runs", params={"tag": marker, "order_by": "-max(train/my_reward)"})
    assert r.status_code == 200 and r.json()["items"][0]["id"] == ext["id"], r.text
    assert api.delete(f"/api/runs/{ext['id']}").status_code == 204


def test_where_algorithm_finds_no_sft_run(api):
    """Issue 49: an SFT run stored algorithm: conspo and ConSPO's params, so looking for ConSPO
    runs found it. A kind that trains no algorithm stores none."""
    from tests.api.conftest import tiny_config

    marker = f"kinds-{uuid.uuid4().hex[:8]}"
    made = {}
    for kind in ("rl", "sft"):
        config = {**tiny_config(2), "kind": kind, "algorithm": "conspo"}
        r = api.post("/api/runs", json={"config": config, "tags": [marker]})
        assert r.status_code == 201, r.text
        made[kind] = r.json()["runs"][0]
    sft = made["sft"]
    assert sft["algorithm"] is None and sft["config"]["algorithm"] is None
    assert sft["config"]["params"] == {} and not sft["name"].startswith("conspo")
    assert found(api, marker, "algorithm=conspo") == {made["rl"]["id"]}
    assert found(api, marker, "params.tau>0") == {made["rl"]["id"]}
