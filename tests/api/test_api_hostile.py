"""Hostile input never poisons anything and never gets a 5xx (issue 9, classes 4 and 5).

A table of hostile requests against every POST endpoint (and the query and path parameters of
the reads), on SQLite and PostgreSQL, through a real HTTP server: each gets a 4xx whose ``loc``
(or, for a body that is not JSON at all, whose ``detail``) names what is wrong. Afterwards the
runs list, every run accepted on the way, a run's stream and the live runs stream still work.
Also: whatever the API accepts comes back unchanged from GET /api/runs; a row holding what
validation refuses (written behind the API's back) breaks no read; a request that fails in the
database leaves nothing half-written; an unexpected exception is a JSON 500.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import unicodedata
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text, update

from backend.db import Database
from backend.main import create_app
from backend.models import Run, utcnow
from conspo.input_checks import json_problem
from tests.api.conftest import Api, live_server, tiny_config

PORTS = range(18400, 18450)
MB = 1024 * 1024


def deep(levels: int, leaf: Any = 1, array: bool = False) -> Any:
    for _ in range(levels):
        leaf = [leaf] if array else {"a": leaf}
    return leaf


@dataclass
class Raw:
    """A body sent byte for byte (``1e400``, invalid UTF-8, numbers JSON cannot spell)."""

    data: bytes
    content_type: str | None = "application/json"


def raw_json(body: Any, **literals: str) -> Raw:
    """``body`` as JSON with each string ``"@name"`` replaced by the literal ``literals[name]``."""
    out = json.dumps(body)
    for name, literal in literals.items():
        out = out.replace(json.dumps(f"@{name}"), literal)
    return Raw(out.encode())


@dataclass
class Case:
    """A hostile request and what it must get: ``where`` is the loc prefix that names the
    field ("config.optim.weight_decay", "tags.0"), or for a body refused before validation
    "<status>: <a piece of the detail>"."""

    path: str  # "{ext}": an external run of alice's; "{src}": a worker run to clone
    body: Any
    where: str

    @property
    def status(self) -> int:
        return int(self.where.split(":")[0]) if ":" in self.where else 422

    def names_the_problem(self, response: httpx.Response) -> bool:
        detail = response.json()["detail"]
        if ":" in self.where:
            return isinstance(detail, str) and self.where.split(": ", 1)[1] in detail
        parts = self.where.split(".") if self.where else []
        loc = ["body", *(int(p) if p.isdigit() else p for p in parts)]
        return any(e["loc"][: len(loc)] == loc for e in detail)


RUNS, EXT, LOG, CLONE = (
    "/api/runs",
    "/api/runs/external",
    "/api/runs/{ext}/log",
    "/api/runs/{src}/clone",
)


def config(section: str, field: str, value: Any) -> dict[str, Any]:
    return {"config": {section: {field: value}}}


def external(**fields: Any) -> dict[str, Any]:
    return {"name": "hostile", "algorithm": "grpo", "task": "arith", "model": "tiny", **fields}


def metrics(values: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"steps": [{"step": 1, "metrics": values, **fields}]}


POST_CASES = [
    # POST /api/runs: the typed config and the request's own fields
    Case(RUNS, {"config": {"params": deep(300)}}, "config.params"),
    Case(RUNS, {"config": {"sampling": deep(300)}}, "config.sampling"),
    Case(RUNS, config("sampling", "temperature", math.nan), "config.sampling.temperature"),
    Case(RUNS, config("optim", "max_grad_norm", math.inf), "config.optim.max_grad_norm"),
    Case(
        RUNS,
        raw_json(config("optim", "weight_decay", "@x"), x="1e400"),
        "config.optim.weight_decay",
    ),
    Case(RUNS, config("optim", "weight_decay", 1e300), "config.optim.weight_decay"),
    Case(RUNS, config("optim", "max_grad_norm", 1e300), "config.optim.max_grad_norm"),
    Case(RUNS, config("optim", "warmup_steps", 2**62), "config.optim.warmup_steps"),
    Case(RUNS, config("eval", "temperature", 1e6), "config.eval.temperature"),
    Case(RUNS, config("params", "tau", math.inf), "config.params.tau"),
    Case(RUNS, config("params", "overlong_buffer", 2**70), "config.params.overlong_buffer"),
    Case(RUNS, config("model", "name", "m" * 5000), "config.model.name"),
    Case(RUNS, config("model", "name", "tiny\x00"), "config.model.name"),
    Case(RUNS, config("task", "params", {"path": "a\x00"}), "config.task.params.path"),
    Case(RUNS, {"config": {"steps": math.nan}}, "config.steps"),
    Case(RUNS, {"config": {"name": "run\x1b[2J"}}, "config.name"),
    Case(RUNS, {"config": {"k" * 10_000: 1}}, "config"),
    Case(RUNS, {"config": {}, "name": "a\ud800"}, "name"),
    Case(RUNS, {"config": {}, "name": "n" * (10 * MB)}, "name"),
    Case(RUNS, {"config": {}, "name": "n" * 195, "seeds": [0, 100_000]}, "name"),
    Case(RUNS, {"config": {}, "tags": ["\udfff"]}, "tags.0"),
    Case(RUNS, {"config": {}, "tags": ["t" * 10_000]}, "tags.0"),
    Case(RUNS, {"config": {}, "tags": ["a\nb"]}, "tags.0"),
    Case(RUNS, {"config": {}, "seeds": [2**70]}, "seeds.0"),
    Case(RUNS, raw_json({"config": {}, "seeds": ["@x"]}, x="1e400"), "seeds.0"),
    # POST /api/runs/external: the free-form config and the run's own fields
    Case(EXT, external(config=deep(300)), "config"),
    Case(EXT, external(config={"x": deep(100, array=True)}), "config"),
    Case(EXT, external(config={"x": "\ud800"}), "config"),
    Case(EXT, external(config={"\udbff": 1}), "config"),
    Case(EXT, external(config={"x": "a\x00"}), "config"),
    Case(EXT, external(config={"x": [1, math.nan]}), "config"),
    Case(EXT, external(config={"x": {"y": -math.inf}}), "config"),
    Case(EXT, raw_json(external(config={"x": "@x"}), x="1e400"), "config"),
    Case(EXT, external(config={"x": 2**64}), "config"),
    Case(EXT, external(config={"x": "s" * (10 * MB)}), "config"),
    Case(EXT, external(config={"k" * 10_000: 1}), "config"),
    Case(EXT, external(name="\ud800"), "name"),
    Case(EXT, external(model="m" * 5000), "model"),
    Case(EXT, external(model="m\x00"), "model"),
    Case(EXT, external(algorithm="grpo\n"), "algorithm"),
    Case(EXT, external(total_steps=-1), "total_steps"),
    Case(EXT, external(total_steps=2**40), "total_steps"),
    Case(EXT, external(tags=["\x00"]), "tags.0"),
    # POST /api/runs/{id}/clone
    Case(CLONE, {"overrides": deep(700)}, "overrides"),
    Case(CLONE, {"overrides": {"sampling": {"temperature": math.nan}}}, "overrides"),
    Case(CLONE, {"overrides": {"eval": {"temperature": 1e308}}}, "overrides.eval.temperature"),
    Case(CLONE, {"overrides": {"model": {"name": "m" * 5000}}}, "overrides.model.name"),
    Case(CLONE, {"overrides": [1]}, "overrides"),
    Case(CLONE, {"name": "\ud800"}, "name"),
    # POST /api/runs/{id}/log
    Case(LOG, metrics({"\ud800": 1.0}), "steps.0.metrics"),
    Case(LOG, metrics({"a\x00": 1.0}), "steps.0.metrics"),
    Case(LOG, metrics({"k" * 10_000: 1.0}), "steps.0.metrics"),
    Case(LOG, metrics({}, wall_time=math.nan), "steps.0.wall_time"),
    Case(LOG, raw_json(metrics({}, wall_time="@x"), x="1e400"), "steps.0.wall_time"),
    Case(LOG, {"steps": [{"step": 2**40}]}, "steps.0.step"),
    Case(
        LOG, {"rollouts": [{"step": 1, "group": 0, "index": 0, "length": -1}]}, "rollouts.0.length"
    ),
    Case(LOG, {"error": "boom \udc00"}, "error"),
    Case(LOG, {"error": "boom\x00"}, "error"),
    # Bodies that are not JSON, or not readable as JSON
    Case(EXT, Raw(b'{"name": "\xff\xfe"}'), "400: UTF-8"),
    Case(EXT, Raw(b"\xff\xfe{", "text/plain"), "415: JSON"),
    Case(EXT, Raw(json.dumps(external()).encode(), "text/plain"), "415: JSON"),
    Case(RUNS, Raw(b'{"config": {}}', None), "415: JSON"),
    Case(RUNS, Raw(b'{"config": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "400: nested"),
    Case(RUNS, Raw(b'{"config": {"steps": ' + b"9" * 5000 + b"}}"), "400: integer"),
    Case(EXT, Raw(b'{"name": '), ""),
]

GET_CASES = [
    ("/api/runs", {"limit": "-1"}, ["query", "limit"]),
    ("/api/runs", {"limit": str(10**30)}, ["query", "limit"]),
    ("/api/runs", {"offset": str(10**30)}, ["query", "offset"]),
    ("/api/runs", {"ids": "99999999999999999999"}, ["query", "ids"]),
    ("/api/runs", {"ids": "1,\u00b2"}, ["query", "ids"]),  # a digit to isdigit(), not to int()
    ("/api/runs", {"ids": "9" * 5000}, ["query", "ids"]),  # past int()'s 4300-digit limit
    ("/api/compare", {"runs": "\u00b9", "keys": "a"}, ["query", "runs"]),
    ("/api/runs", {"tag": "a\x00"}, ["query", "tag"]),
    ("/api/runs", {"q": "x" * 201}, ["query", "q"]),
    ("/api/runs/{ext}/metrics", {"keys": "a", "max_points": str(10**30)}, ["query", "max_points"]),
    (
        "/api/runs/{ext}/metrics",
        {"keys": "a", "since_step": str(-(10**30))},
        ["query", "since_step"],
    ),
    ("/api/runs/{ext}/metrics", {"keys": "a\x01"}, ["query", "keys"]),
    ("/api/runs/{ext}/rollouts", {"step_min": "-1"}, ["query", "step_min"]),
    ("/api/compare", {"runs": "1", "keys": "a," + "k" * 300}, ["query", "keys"]),
    ("/api/runs/99999999999999999999", {}, ["path", "run_id"]),
    ("/api/runs/-1", {}, ["path", "run_id"]),
]
# Every mutating endpoint's run id, with a bad id (none of these runs exists: a 422, not a 404)
ID_CASES = [
    (method, f"/api/runs/{run_id}{action}")
    for method, action in [("POST", "/cancel"), ("POST", "/clone"), ("POST", "/log")]
    + [("DELETE", "")]
    for run_id in ["99999999999999999999", "-1", "0", "%C2%B2"]
]


@pytest.fixture(scope="module")
def live(api: Api) -> Iterator[str]:
    """A real server on the module's database (the ``api`` fixture's), polling streams often."""
    with live_server(api.settings.model_copy(update={"stream_poll_s": 0.2}), PORTS) as url:
        yield url


def send(client: httpx.Client, url: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    if isinstance(body, Raw):
        extra = {"content-type": body.content_type} if body.content_type else {}
        return client.post(url, content=body.data, headers={**headers, **extra})
    # allow_nan spells NaN/Infinity; ensure_ascii sends unpaired surrogates as \\udXXX escapes
    data = json.dumps(body, allow_nan=True, ensure_ascii=True).encode()
    return client.post(url, content=data, headers={**headers, "content-type": "application/json"})


def test_hostile_requests_get_a_4xx_naming_the_field(api: Api, live: str) -> None:
    ext = api.external(name="hostile-target")
    src = api.post("/api/runs", json={"config": tiny_config(2)}).json()["runs"][0]
    ids = {"ext": ext["id"], "src": src["id"]}
    headers = api.h("alice")
    wrong = []
    with httpx.Client(base_url=live, timeout=120) as client:
        for case in POST_CASES:
            r = send(client, case.path.format(**ids), case.body, headers)
            if r.status_code != case.status or not case.names_the_problem(r):
                wrong.append(f"{case.path} {case.where}: {r.status_code} {r.text[:300]}")
        for path, params, loc in GET_CASES:
            r = client.get(path.format(**ids), params=params)
            if r.status_code != 422 or not any(e["loc"] == loc for e in r.json()["detail"]):
                wrong.append(f"GET {path} {params}: {r.status_code} {r.text[:300]}")
        for method, path in ID_CASES:
            r = client.request(method, path, json={}, headers=headers)
            if r.status_code != 422 or ["path", "run_id"] not in locs(r):
                wrong.append(f"{method} {path}: {r.status_code} {r.text[:300]}")
    assert not wrong, "\n".join(wrong)
    assert_reads_work(api, live, [ext["id"], src["id"]])


def test_bodies_over_the_limit_get_413_however_they_are_sent(api: Api, live: str) -> None:
    body = json.dumps(external(config={"x": "s" * (20 * MB)})).encode()
    h = {**api.h("alice"), "content-type": "application/json"}
    with httpx.Client(base_url=live, timeout=120) as client:
        declared = client.post(EXT, content=body, headers=h)
        chunks = [body[i : i + MB] for i in range(0, len(body), MB)]
        chunked = client.post(EXT, content=iter(chunks), headers=h)
    for r in (declared, chunked):
        assert r.status_code == 413 and "over" in r.json()["detail"], r.text[:300]


def test_unicode_tricks_in_tags_are_one_tag_each_and_round_trip(api: Api) -> None:
    marker = uuid.uuid4().hex
    tricks = [
        "e\u0301" + marker,  # decomposed é: the same tag as the composed one after it
        "\u00e9" + marker,
        "\ufb00",  # the ﬀ ligature: not canonically equivalent to "ff", kept as is
        "\u202eevil",  # a right-to-left override: shown as sent, never interpreted here
        "zero\u200bwidth",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a ZWJ emoji sequence
        "\u0344" * 50,  # expands to 100 characters under NFC: still within the limit
    ]
    r = api.post("/api/runs/external", json=external(tags=tricks))
    assert r.status_code == 201, r.text
    expected = list(dict.fromkeys(unicodedata.normalize("NFC", t) for t in tricks))
    assert r.json()["tags"] == expected and len(expected) == len(tricks) - 1
    got = api.get("/api/runs", params={"tag": "e\u0301" + marker}).json()
    assert [x["id"] for x in got["items"]] == [r.json()["id"]]
    too_long = api.post("/api/runs/external", json=external(tags=["\u0344" * 51]))
    assert too_long.status_code == 422 and ["body", "tags", 0] in locs(too_long)


def locs(response: Any) -> list[list[Any]]:
    return [e["loc"] for e in response.json()["detail"]]


# --- whatever is accepted renders again -----------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats()  # NaN and ±Infinity included
    | st.text(st.characters(exclude_categories=()), max_size=20)  # unpaired surrogates too
)
json_keys = st.text(st.characters(exclude_categories=()), max_size=10)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_keys, inner, max_size=4),
    max_leaves=25,
)


@given(config=st.dictionaries(json_keys, json_values, max_size=6))
@example(config={"deep": deep(31), "big": 2**63 - 1, "tiny": -(2**63), "f": 1e308, "k" * 1000: ""})
@example(config={"deep": deep(32)})
@example(config={"pair": "\ud83d\ude00"})  # two escapes that JSON reads as one emoji
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_any_accepted_config_round_trips_through_the_runs_list(api: Api, config: dict) -> None:  # type: ignore[type-arg]
    """Refused (422 at body.config) exactly when ``json_problem`` finds something stored JSON
    may not hold; otherwise stored and read back as sent, on either engine."""
    body = json.dumps(external(config=config), allow_nan=True).encode()
    sent = json.loads(body)["config"]  # what the JSON said (an escaped pair is one character)
    r = api.post(EXT, content=body, headers={"content-type": "application/json"})
    assert r.status_code == (422 if json_problem(sent) else 201), r.text[:300]
    if r.status_code == 422:
        assert ["body", "config"] in locs(r), r.text[:300]
        return
    run_id = r.json()["id"]
    listed = api.get("/api/runs", params={"ids": str(run_id)})
    assert listed.status_code == 200 and listed.json()["items"][0]["config"] == sent
    assert api.delete(f"/api/runs/{run_id}").status_code == 204


# --- a bad row breaks no read ---------------------------------------------------------------

BAD_VALUES: list[tuple[str, Any]] = [
    ("config", {"deep": deep(300)}),
    ("config", {"nan": math.nan, "inf": math.inf}),
    ("config", {"lone": "\ud800", "\udfff": 1}),
    ("config", {"nul": "\x00"}),
    ("tags", ["\ud800", "ok"]),
    ("summary", {"x": math.inf}),
    ("error", "traceback \ud800"),
]


def test_a_row_holding_bad_data_breaks_no_read(api: Api, live: str) -> None:
    """Rows written behind the API's back with what validation refuses: each engine stores
    what it can, and every read that shows the row still answers."""
    db = Database(api.settings)
    stored = []
    try:
        for column, value in BAD_VALUES:
            run_id = api.external(name=f"bad-{column}")["id"]
            with db.session() as session:
                try:
                    stmt = update(Run).where(Run.id == run_id)
                    session.execute(stmt.values({column: value, "updated_at": utcnow()}))
                    session.commit()
                    stored.append(run_id)
                except Exception:  # noqa: BLE001 - this engine cannot hold it at all
                    session.rollback()
    finally:
        db.dispose()
    assert stored, "the engine refused every bad value; the test would test nothing"
    for run_id in stored:
        assert api.get(f"/api/runs/{run_id}").status_code == 200
    assert_reads_work(api, live, stored)


def assert_reads_work(api: Api, live: str, run_ids: list[int]) -> None:
    """The runs list, each run, a run's stream and the live runs stream all answer."""
    listed = api.get("/api/runs", params={"limit": 500})
    assert listed.status_code == 200, listed.text[:300]
    for run_id in run_ids:
        assert api.get(f"/api/runs/{run_id}").status_code == 200
    opened = api.external(name="after-hostile")
    with httpx.Client(base_url=live, timeout=60) as client:
        with client.stream("GET", f"/api/runs/{opened['id']}/stream") as stream:
            assert stream.status_code == 200
            assert next(stream.iter_lines()).startswith(("event:", "id:", ":"))
        assert_runs_stream_reports(client, api, opened["id"])


def assert_runs_stream_reports(client: httpx.Client, api: Api, run_id: int) -> None:
    """The runs stream sends an event for ``run_id`` while it keeps logging steps (a step a
    poll, so the event comes whenever the stream's first poll happens, however slow)."""
    done = threading.Event()

    def keep_logging() -> None:
        for n in range(1, 10_000):
            if done.wait(0.3):
                return
            api.post(f"/api/runs/{run_id}/log", json={"steps": [{"step": n, "metrics": {}}]})

    logger = threading.Thread(target=keep_logging, daemon=True)
    logger.start()
    try:
        with client.stream("GET", "/api/stream/runs") as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if line.startswith("data:") and json.loads(line[5:])["id"] == run_id:
                    return
        raise AssertionError("the runs stream ended without an event for the run")
    finally:
        done.set()
        logger.join(timeout=30)


# --- nothing half-written -------------------------------------------------------------------


@pytest.fixture
def refusing_close(api: Api) -> Iterator[str]:
    """A trigger that makes the database refuse closing a run with error ``marker``."""
    marker, name = uuid.uuid4().hex, f"refuse_{uuid.uuid4().hex[:8]}"
    db = Database(api.settings)
    postgres = api.settings.mode == "cluster"
    create = [
        f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN"
        f" IF NEW.error = '{marker}' AND NEW.status <> OLD.status THEN RAISE EXCEPTION"
        " 'refused by a test trigger' USING ERRCODE = 'check_violation'; END IF;"
        " RETURN NEW; END $$ LANGUAGE plpgsql",
        f"CREATE TRIGGER {name} BEFORE UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION {name}()",
    ] if postgres else [
        f"CREATE TRIGGER {name} BEFORE UPDATE OF status ON runs WHEN NEW.error = '{marker}'"
        " BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END",
    ]  # fmt: skip
    drop = [f"DROP TRIGGER {name}" + (" ON runs" if postgres else "")]
    drop += [f"DROP FUNCTION {name}()"] if postgres else []
    run_sql(db, create)
    try:
        yield marker
    finally:
        run_sql(db, drop)
        db.dispose()


def run_sql(db: Database, statements: list[str]) -> None:
    with db.session() as session:
        for statement in statements:
            session.execute(text(statement))
        session.commit()


def test_a_request_failing_in_the_database_writes_nothing(api: Api, refusing_close: str) -> None:
    """Points and the close of a run go in one transaction: when the database refuses the
    close, the points of that call are not kept either, and the run reads as before."""
    run = api.external(name="half-written?")
    body = {"steps": [{"step": 7, "metrics": {"a": 1.0}}], "status": "failed"}
    r = api.post(f"/api/runs/{run['id']}/log", json={**body, "error": refusing_close})
    assert 400 <= r.status_code < 500, r.text
    after = api.get(f"/api/runs/{run['id']}").json()
    assert after["status"] == "running" and after["step"] == 0 and after["error"] is None
    keys = api.get(f"/api/runs/{run['id']}/metrics/keys").json()["keys"]
    assert keys == [] and api.get("/api/runs").status_code == 200


# --- the last resort ------------------------------------------------------------------------


def test_an_unexpected_exception_is_a_logged_json_500(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(api.settings)

    def broken() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/api/broken", broken)
    with caplog.at_level(logging.ERROR), TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/api/broken")
    assert r.status_code == 500 and r.json() == {"detail": "internal server error"}
    assert any("/api/broken" in rec.getMessage() for rec in caplog.records)


def test_page_paths_with_nul_or_escapes_are_404s(api: Api) -> None:
    for path in ("/static/%00", "/static/a%00.js", "/static/..%2f..%2fetc%2fpasswd"):
        r = api.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
