"""Where schemathesis found the API and its OpenAPI document disagreeing (85 distinct failures
before the document was fixed), replayed as plain requests on SQLite and PostgreSQL, so they run
whatever hypothesis draws (tests/api/test_api_schemathesis.py looks for new ones):

* every answer is a status the document lists for its operation, with its content type and,
  for JSON, a body its schema accepts;
* what the document calls invalid the API refuses, and the patterns it states for query
  parameters accept exactly what their parsers accept;
* a token is asked for where, and only where, the document says so (and the document follows
  CONSPO_READS_REQUIRE_TOKEN);
* a method the document does not list for a path is a 405 naming those it does.
"""

from __future__ import annotations

import json
import re
import tempfile
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from backend.api import query
from backend.api.query import parse_ids, parse_keys, parse_order
from backend.config import Settings
from backend.main import create_app
from tests.api.conftest import Api, tiny_config

MISSING = 2_000_000_000  # no run, study or pipeline has this id
BEARER = [{"HTTPBearer": []}]
OPTIONAL = [{}, {"HTTPBearer": []}]


@pytest.fixture(scope="module")
def doc(api: Api) -> dict[str, Any]:
    return api.client.get("/openapi.json").json()


@pytest.fixture(scope="module")
def ids(api: Api) -> dict[str, int]:
    """An external run (running) and a run a worker would run (queued)."""
    external = api.external(name="contract-external")
    queued = api.post("/api/runs", json={"config": tiny_config(2)})
    assert queued.status_code == 201, queued.text
    return {"ext": external["id"], "queued": queued.json()["runs"][0]["id"], "missing": MISSING}


def operation(doc: dict[str, Any], method: str, template: str) -> dict[str, Any]:
    return doc["paths"][template][method.lower()]


def schema_of(doc: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A validator of ``schema``, its references resolved in ``doc``."""
    return Draft202012Validator({**schema, "components": doc["components"]})


def assert_documented(doc: dict[str, Any], method: str, template: str, response: Any) -> None:
    """The status is one the operation lists, with its content type and (JSON) body schema."""
    responses = operation(doc, method, template)["responses"]
    status = str(response.status_code)
    assert status in responses, f"{method} {template}: {status} is not in {sorted(responses)}"
    content = responses[status].get("content")
    if not content:
        return
    media_type = response.headers["content-type"].split(";")[0]
    assert media_type in content, f"{method} {template} {status}: {media_type} not in {content}"
    schema = content[media_type].get("schema")
    if media_type == "application/json" and schema:
        errors = list(schema_of(doc, schema).iter_errors(response.json()))
        assert not errors, f"{method} {template} {status}: {errors[0].message}"


def body_is_valid(doc: dict[str, Any], method: str, template: str, body: Any) -> bool:
    schema = operation(doc, method, template)["requestBody"]["content"]["application/json"]
    return schema_of(doc, schema["schema"]).is_valid(body)


def param_pattern(doc: dict[str, Any], method: str, template: str, name: str) -> str:
    params = operation(doc, method, template)["parameters"]
    return next(p["schema"]["pattern"] for p in params if p["name"] == name)


# --- every answer is documented ------------------------------------------------------------

# (method, path template, path ids, anonymous?, body or raw bytes, the status it gets); the
# statuses schemathesis found undocumented
ANSWERS = [
    # a write without a token: 401, before anything else (a missing run is not a 404 to it)
    ("POST", "/api/runs", {}, True, {"config": {}}, 401),
    ("POST", "/api/runs/external", {}, True, {"name": "x"}, 401),
    ("POST", "/api/studies", {}, True, {"name": "x"}, 401),
    ("POST", "/api/pipelines", {}, True, {"name": "x", "stages": [{}]}, 401),
    ("DELETE", "/api/runs/{run_id}", {"run_id": "missing"}, True, None, 401),
    ("POST", "/api/runs/{run_id}/clone", {"run_id": "missing"}, True, {}, 401),
    ("PATCH", "/api/pipelines/{pipeline_id}", {"pipeline_id": "missing"}, True, {"note": ""}, 401),
    ("POST", "/api/pipelines/{pipeline_id}/cancel", {"pipeline_id": "missing"}, True, None, 401),
    ("POST", "/api/studies/{study_id}/cancel", {"study_id": "missing"}, True, None, 401),
    # a download with neither a token nor a ticket (the export's download_url brings one)
    ("GET", "/api/runs/{run_id}/export", {"run_id": "ext"}, True, None, 401),
    # what is not there: 404
    ("GET", "/api/runs/{run_id}", {"run_id": "missing"}, True, None, 404),
    ("GET", "/api/runs/{run_id}/log", {"run_id": "missing"}, True, None, 404),
    ("GET", "/api/runs/{run_id}/metrics/keys", {"run_id": "missing"}, True, None, 404),
    ("GET", "/api/runs/{run_id}/prompts", {"run_id": "missing"}, True, None, 404),
    ("GET", "/api/runs/{run_id}/rollouts", {"run_id": "missing"}, True, None, 404),
    ("GET", "/api/studies/{study_id}", {"study_id": "missing"}, True, None, 404),
    ("GET", "/api/studies/{study_id}/objective.csv", {"study_id": "missing"}, True, None, 404),
    ("GET", "/api/studies/{study_id}/report.html", {"study_id": "missing"}, True, None, 404),
    ("GET", "/api/pipelines/{pipeline_id}", {"pipeline_id": "missing"}, True, None, 404),
    ("PATCH", "/api/runs/{run_id}", {"run_id": "missing"}, False, {"note": ""}, 404),
    ("DELETE", "/api/runs/{run_id}", {"run_id": "missing"}, False, None, 404),
    ("POST", "/api/runs/{run_id}/cancel", {"run_id": "missing"}, False, None, 404),
    ("POST", "/api/runs/{run_id}/clone", {"run_id": "missing"}, False, {}, 404),
    ("POST", "/api/runs/{run_id}/log", {"run_id": "missing"}, False, {}, 404),
    ("POST", "/api/models/{run_id}/export", {"run_id": "missing"}, False, {}, 404),
    ("PATCH", "/api/studies/{study_id}", {"study_id": "missing"}, False, {"note": ""}, 404),
    ("POST", "/api/studies/{study_id}/cancel", {"study_id": "missing"}, False, None, 404),
    ("PATCH", "/api/pipelines/{pipeline_id}", {"pipeline_id": "missing"}, False, {"note": ""}, 404),
    ("POST", "/api/pipelines/{pipeline_id}/cancel", {"pipeline_id": "missing"}, False, None, 404),
    # a state that does not allow it: 409
    ("POST", "/api/runs/{run_id}/clone", {"run_id": "ext"}, False, {}, 409),
    ("POST", "/api/runs/{run_id}/log", {"run_id": "queued"}, False, {}, 409),
    # a body that is not UTF-8 JSON: 400, 415
    ("POST", "/api/pipelines", {}, False, b"\xcf", 400),
    ("POST", "/api/runs/{run_id}/log", {"run_id": "ext"}, False, b"B\xc2\x06p\x7f", 400),
    ("POST", "/api/runs/external", {}, False, ("text/plain", b"{}"), 415),
]


@pytest.mark.parametrize(
    "method,template,path_ids,anonymous,body,status",
    ANSWERS,
    ids=[f"{a[0]} {a[1]} {a[5]}" for a in ANSWERS],
)
def test_every_answer_is_one_the_document_lists(
    api: Api,
    doc: dict[str, Any],
    ids: dict[str, int],
    method: str,
    template: str,
    path_ids: dict[str, str],
    anonymous: bool,
    body: Any,
    status: int,
) -> None:
    path = template.format(**{name: ids[which] for name, which in path_ids.items()})
    headers = {} if anonymous else api.h("root")
    if isinstance(body, tuple):
        headers["content-type"], body = body
    if isinstance(body, bytes):
        headers.setdefault("content-type", "application/json")
        r = api.client.request(method, path, headers=headers, content=body)
    else:
        r = api.client.request(method, path, headers=headers, json=body)
    assert r.status_code == status, r.text
    assert_documented(doc, method, template, r)


def test_the_exports_are_the_media_types_the_document_says(
    api: Api, doc: dict[str, Any], ids: dict[str, int]
) -> None:
    for path in ("/api/compare/objective.csv", "/api/compare/report.html"):
        found = api.get(path, params={"runs": str(ids["ext"])})
        missing = api.get(path, params={"runs": str(MISSING)})  # a 404 is JSON, even here
        assert (found.status_code, missing.status_code) == (200, 404)
        assert_documented(doc, "GET", path, found)
        assert_documented(doc, "GET", path, missing)
    assert (
        api.get("/api/compare/objective.csv", params={"runs": str(ids["ext"])})
        .headers["content-type"]
        .startswith("text/csv")
    )


def test_every_operation_with_a_body_documents_its_refusals(doc: dict[str, Any]) -> None:
    for template, methods in doc["paths"].items():
        for method, op in methods.items():
            if "requestBody" in op:
                assert {"400", "413", "415", "422"} <= set(op["responses"]), (method, template)


# --- what the document calls invalid is refused, and valid accepted ------------------------

# schema-valid by the old document, refused by the API: the document now says they are invalid
QUERIES = [
    ("/api/compare", "runs", "0", {"keys": "a"}),
    ("/api/runs", "ids", "0" * 200, {}),
    ("/api/runs", "order_by", "000", {}),
    ("/api/runs/{run_id}/metrics", "keys", "ìîñ\x0c4¨", {}),
    ("/api/compare", "keys", "a\x01", {"runs": "1"}),
    # PostgreSQL's text cannot hold NUL: the API refused it, the document did not say so
    ("/api/runs/{run_id}/answers/history", "source", "h\x05\x00@", {"problem": "54a485e12"}),
]


@pytest.mark.parametrize("template,name,value,others", QUERIES, ids=[q[1] for q in QUERIES])
def test_a_query_value_the_document_refuses_is_a_422(
    api: Api,
    doc: dict[str, Any],
    ids: dict[str, int],
    template: str,
    name: str,
    value: str,
    others: dict[str, str],
) -> None:
    assert re.search(param_pattern(doc, "GET", template, name), value) is None
    r = api.get(template.format(run_id=ids["ext"]), params={name: value, **others})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", name], r.text


# (method, path template, body) refused by the API, and now by the document too: the first
# three it called valid; the last one schemathesis sent as invalid, and the API took it
BODIES = [
    ("PATCH", "/api/runs/{run_id}", {}),
    ("POST", "/api/studies/check", {"name": "distill", "seeds": [0]}),
    ("POST", "/api/runs/external", {"name": "n", "algorithm": "a", "task": "ò\x81n", "model": "m"}),
    (
        "POST",
        "/api/runs/external",
        {"name": "n", "algorithm": "a", "task": "t", "model": "m", "total_steps": False},
    ),  # fmt: skip
]


@pytest.mark.parametrize("method,template,body", BODIES, ids=[str(i) for i in range(len(BODIES))])
def test_a_body_the_document_refuses_is_a_422(
    api: Api, doc: dict[str, Any], ids: dict[str, int], method: str, template: str, body: Any
) -> None:
    assert not body_is_valid(doc, method, template, body)
    r = api.client.request(
        method, template.format(run_id=ids["ext"]), json=body, headers=api.h("root")
    )
    assert r.status_code == 422, r.text


def test_what_the_document_calls_valid_is_accepted(
    api: Api, doc: dict[str, Any], ids: dict[str, int]
) -> None:
    """Integers written 5.0 (an integer to JSON Schema), and one field of a patch."""
    body = {"name": "n", "algorithm": "a", "task": "t", "model": "m", "total_steps": 118004.0}
    assert body_is_valid(doc, "POST", "/api/runs/external", body)
    r = api.post("/api/runs/external", json=body)
    assert r.status_code == 201 and r.json()["total_steps"] == 118004, r.text
    patch = {"tags": ["contract"]}
    assert body_is_valid(doc, "PATCH", "/api/runs/{run_id}", patch)
    assert api.patch(f"/api/runs/{ids['ext']}", json=patch).status_code == 200


# The query patterns mean what their parsers accept: the alphabets hold what each grammar
# treats specially (separators, spaces, controls, digits that are not ASCII).
def _parses(parse: Any, raw: str) -> bool:
    try:
        parse(raw)
    except Exception:  # noqa: BLE001 - a RequestValidationError: the 422
        return False
    return True


@given(st.text(alphabet="0123456789, \t\x1c\xa0²-a", max_size=40))
@example("1, ,2")
@example(" 2147483647,")
@example("2147483648")
@example("01")
@example("1,2,3,4")
def test_the_run_ids_pattern_is_what_parse_ids_accepts(raw: str) -> None:
    pattern = query.list_pattern(query.RUN_ID, 3)
    assert (re.search(pattern, raw) is not None) == _parses(lambda r: parse_ids(r, "ids", 3), raw)


@given(st.text(alphabet="ab/@., \t\x01\x7f\x85\xa0é", max_size=30))
@example("a ,b")
@example(" a\xa0")
@example("a,a,a")
@example("a" * 201)
def test_the_metric_keys_pattern_is_what_parse_keys_accepts(raw: str) -> None:
    pattern = query.list_pattern(query.KEY, 2)
    accepted = _parses(lambda r: parse_keys(r, "keys", 2), raw)
    assert (re.search(pattern, raw) is not None) == accepted


@given(st.text(alphabet="-params.tau_BESTmax(eval/acc)1 \t\x1c\n", max_size=30))
@example("-max(system/peak_rss_gib)")
@example("best (a) ")
@example("params.tau\n")
@example("bestx(a)")
def test_the_order_by_pattern_is_what_parse_order_accepts(raw: str) -> None:
    blank = not raw.strip()  # no order at all, as the handler reads it
    accepted = blank or _parses(parse_order, raw)
    assert (re.search(query.ORDER, raw) is not None) == accepted


# --- a token where, and only where, the document says --------------------------------------


def test_reads_and_checks_need_no_token_as_the_document_says(
    api: Api, doc: dict[str, Any], ids: dict[str, int]
) -> None:
    public = ["/api/runs", "/api/presets", "/api/metrics/catalogue", "/api/pipelines"]
    for path in public:
        assert operation(doc, "GET", path)["security"] == []
        assert api.get(path).status_code == 200, path
    assert operation(doc, "GET", "/api/models")["security"] == OPTIONAL
    assert api.get("/api/models").status_code == 200
    assert api.get("/api/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    for template in ("/api/runs/estimate", "/api/studies/check"):
        assert operation(doc, "POST", template)["security"] == OPTIONAL
    assert api.post("/api/runs/estimate", user=None, json={"config": {}}).status_code == 200
    assert api.post("/api/studies/check", user=None, json={}).status_code == 422


def test_every_write_needs_a_token_and_says_so(doc: dict[str, Any]) -> None:
    optional = {("post", "/api/runs/estimate"), ("post", "/api/studies/check")}
    for template, methods in doc["paths"].items():
        for method, op in methods.items():
            if method != "get" and (method, template) not in optional:
                assert op["security"] == BEARER, (method, template)
                assert "401" in op["responses"], (method, template)


def test_the_document_follows_reads_require_token() -> None:
    with tempfile.TemporaryDirectory() as data:
        guarded = create_app(Settings(data_dir=data, reads_require_token=True)).openapi()
    for template, methods in guarded["paths"].items():
        if "get" in methods and template != "/api/health":
            assert methods["get"]["security"] == BEARER, template
            assert "401" in methods["get"]["responses"], template
    assert guarded["paths"]["/api/health"]["get"]["security"] == []


# --- a method the document does not list is a 405 naming those it does ----------------------

METHODS = [
    ("PATCH", "/api/runs/estimate", "POST"),  # not a PATCH of the run "estimate"
    ("DELETE", "/api/runs/external", "POST"),
    ("GET", "/api/studies/check", "POST"),
    ("OPTIONS", "/api/runs", "GET, POST"),
    ("OPTIONS", "/api/runs/1", "DELETE, GET, PATCH"),
    ("PUT", "/api/runs/1/log", "GET, POST"),
    ("OPTIONS", "/api/studies/1", "GET, PATCH"),
]


@pytest.mark.parametrize("method,path,allow", METHODS, ids=[f"{m[0]} {m[1]}" for m in METHODS])
def test_a_method_not_documented_is_a_405_naming_the_documented_ones(
    api: Api, method: str, path: str, allow: str
) -> None:
    r = api.client.request(method, path, headers=api.h("root"))
    assert r.status_code == 405 and r.headers["allow"] == allow, (r.status_code, r.headers)
    assert json.loads(r.text) == {"detail": "Method Not Allowed"}
