"""schemathesis hooks of the contract test (tests/api/schemathesis.toml loads them): the few
outcomes no OpenAPI document can state, each dropped narrowly (only that outcome, only there),
with why. Everything else is a contract failure."""

from __future__ import annotations

import json
from typing import Any

import schemathesis

# Schema-valid requests refused only at these fields, by rules no JSON schema can state:
NOT_IN_A_SCHEMA: dict[str, list[tuple[str, ...]]] = {
    # the query language of backend.runs.where is no regular expression (a number must be
    # finite, true and false compare with = and != only), and whether a config path or a metric
    # key in where or order_by is known depends on the stored runs (a name no run config defines
    # or no catalogue declares is refused only when no run holds it either);
    # tests/api/test_api_where.py holds both
    "GET /api/runs": [("query", "where"), ("query", "order_by")],
    # whether the runs sampled rollouts, a step in common, and that step: the stored rollouts
    # decide (tests/api/test_api_rollouts_across_runs.py holds each refusal)
    "GET /api/compare/rollouts": [("query", "runs"), ("query", "step")],
    # whether the runs stored answers, and at that step, and show=only's two runs among them:
    # the stored evaluations decide (tests/api/test_api_answers.py holds each refusal)
    "GET /api/answers": [("query", "runs"), ("query", "step"), ("query", "a")],
    "GET /api/runs/{run_id}/answers": [("query", "runs"), ("query", "step")],
    # a webhook URL may not name a private address, and a metric rule needs its fields: checked
    # together in the handler (tests/api/test_api_alerts.py holds each refusal)
    "POST /api/alerts": [
        ("body", "webhook"),
        ("body", "metric"),
        ("body", "comparison"),
        ("body", "threshold"),
        ("body", "stall_minutes"),
        ("body", "study_id"),
    ],
}
# uvicorn's HTTP parser refuses a request line and headers over 64 KiB before the app sees the
# request: a transport limit of the server, not an operation's answer (a query parameter of
# 20,000 characters, each percent-encoded in up to 12, can pass it).
UNPARSED = b"Invalid HTTP request received."
LONG_URL = 60_000  # characters: the 64 KiB less what the other lines of the request take


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """False (drop it) for a failure that is one of the outcomes above."""
    return not (
        _past_the_parser(response)
        or _null_from_a_link(failure, case)
        or _refused_where_no_schema_can_say(failure, case, response)
    )


def _past_the_parser(response: Any) -> bool:
    url = response.request.url or ""
    return response.status_code == 400 and response.content == UNPARSED and len(url) > LONG_URL


def _null_from_a_link(failure: Any, case: Any) -> bool:
    """The stateful phase fills a path parameter from a response field that is null (a run's
    pipeline_id when it is no pipeline's stage) and sends ``/api/pipelines/None``, which it
    then counts a schema-valid request: the integer parameter's 422 is right."""
    if "positive_data_acceptance" not in failure.checks:
        return False
    return any(value is None for value in (case.path_parameters or {}).values())


def _refused_where_no_schema_can_say(failure: Any, case: Any, response: Any) -> bool:
    if "positive_data_acceptance" not in failure.checks or response.status_code != 422:
        return False
    fields = NOT_IN_A_SCHEMA.get(f"{case.method} {case.path}")
    try:
        errors = json.loads(response.content)["detail"]
    except (ValueError, KeyError, TypeError):
        return False
    if not fields or not isinstance(errors, list) or not errors:
        return False
    return all(any(tuple(error.get("loc", ()))[: len(f)] == f for f in fields) for error in errors)
