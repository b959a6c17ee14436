"""The runs list shows the value it is ordered by (issue 49: ordered by max, the list showed each
run's last value, so the column read out of order): with ``order_by`` every item carries its
``order_value``, the summary or config value the order compared."""

from __future__ import annotations

import uuid

import pytest

from tests.api.conftest import Api
from tests.api.test_api_where import make_runs

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def runs(api: Api) -> tuple[str, dict[str, int]]:
    marker = f"order-{uuid.uuid4().hex[:8]}"
    return marker, make_runs(api, marker)


def listed(api: Api, marker: str, **params: str) -> list[tuple[int, object]]:
    r = api.get("/api/runs", params={"tag": marker, "limit": 500, **params})
    assert r.status_code == 200, r.text
    return [(run["id"], run["order_value"]) for run in r.json()["items"]]


def test_each_run_carries_the_summary_it_is_ordered_by(api: Api, runs) -> None:
    marker, ids = runs
    by_max = listed(api, marker, order_by="-max(sep/gap)")
    # conspo-t8-poor's sep/gap went 0.3, 0.1, -0.2: its max leads, its last would trail
    assert by_max[:3] == [(ids["conspo-t5-good"], pytest.approx(0.4)),
                          (ids["conspo-t8-poor"], pytest.approx(0.3)),
                          (ids["grpo-good"], pytest.approx(0.2))]  # fmt: skip
    assert dict(by_max)[ids["no-metrics"]] is None  # no series: no value, listed last
    values = [v for _, v in by_max if v is not None]
    assert values == sorted(values, reverse=True)  # the column reads in order
    by_min = dict(listed(api, marker, order_by="min(sep/gap)"))
    assert by_min[ids["conspo-t8-poor"]] == pytest.approx(-0.2)


def test_a_config_order_carries_the_config_value(api: Api, runs) -> None:
    marker, ids = runs
    by_tau = dict(listed(api, marker, order_by="params.tau"))
    assert by_tau[ids["conspo-t2"]] == 2 and by_tau[ids["conspo-t8-poor"]] == 8
    assert by_tau[ids["grpo-good"]] == "5"  # stored as text: shown as text


def test_no_order_no_value(api: Api, runs) -> None:
    marker, _ = runs
    assert {v for _, v in listed(api, marker)} == {None}
