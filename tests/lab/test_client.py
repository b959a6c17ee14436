"""conspo_lab.client against a live server (see conftest.py)."""

from __future__ import annotations

import math
import threading
import time

import httpx
import pytest

from conspo.config import RunConfig
from conspo_lab.client import ApiError, Client, ServerUnavailable, _chunk_steps, _parse_sse
from tests.support import closed_port_url


def small_config(**overrides) -> RunConfig:
    return RunConfig.model_validate({"algorithm": "grpo", "steps": 5, **overrides})


def log_points(lab: Client, run_id: int, steps: range, status: str | None = None) -> int:
    rows = [
        {
            "step": s,
            "metrics": {"sep/gap": 0.1 * s, "batch/pass_rate": s / 10, "loss": 1.0 / s},
            "wall_time": 1_700_000_000.0 + s,
        }
        for s in steps
    ]
    return lab.log_steps(run_id, rows, status=status)


# --------------------------------------------------------------------------------------------
# Pure helpers (no server)
# --------------------------------------------------------------------------------------------


def test_parse_sse_events_ids_and_comments():
    lines = [
        ": heartbeat",
        "",
        "event: metrics",
        "id: 3",
        'data: {"step_max": 3}',
        "",
        "event: end",
        "data: {}",
        "",
    ]
    events = list(_parse_sse(lines))
    assert [(e.event, e.id) for e in events] == [("metrics", "3"), ("end", "3")]
    assert events[0].data == {"step_max": 3}


def test_log_payloads_are_chunked_under_the_server_limit():
    steps = [{"step": s, "metrics": {f"k{i}": 1.0 for i in range(3000)}} for s in range(5)]
    chunks = _chunk_steps(steps, 10_000)
    assert [sum(len(r["metrics"]) for r in c) for c in chunks] == [9000, 6000]
    big = _chunk_steps([{"step": 1, "metrics": {f"k{i}": 1.0 for i in range(25_000)}}], 10_000)
    assert [len(c[0]["metrics"]) for c in big] == [10_000, 10_000, 5_000]


def test_unreachable_server_is_a_clear_error():
    with Client(closed_port_url(), "t", timeout=2) as lab, pytest.raises(ServerUnavailable):
        lab.health()


# --------------------------------------------------------------------------------------------
# Live server
# --------------------------------------------------------------------------------------------


def test_health_and_presets(lab):
    health = lab.health()
    assert health.database == "ok" and health.broker == "ok"
    assert health.status == "degraded"  # no worker runs beside this server: health says so
    presets = lab.presets()
    names = {a.name for a in presets.algorithms}
    assert {"conspo", "grpo", "dapo", "dr_grpo"} <= names
    assert presets.defaults["algorithm"] == RunConfig().algorithm


def test_create_list_get_clone_cancel_delete_round_trip(lab):
    sub = lab.create_runs(small_config(), seeds=[0, 1], tags=["roundtrip"], name="rt")
    assert len(sub.runs) == 2 and sub.group_id
    assert sorted(r.seed for r in sub.runs) == [0, 1]
    assert all(r.status == "queued" and r.name.startswith("rt") for r in sub.runs)

    page = lab.list_runs(group_id=sub.group_id)
    assert page.total == 2 and {r.id for r in page.items} == {r.id for r in sub.runs}
    assert lab.list_runs(tag="roundtrip", status="queued").total >= 2
    assert [r.id for r in lab.list_runs(ids=[sub.runs[1].id]).items] == [sub.runs[1].id]

    first = lab.get_run(sub.runs[0].id)
    assert first.config["algorithm"] == "grpo" and first.config["steps"] == 5

    clone = lab.clone(first.id, overrides={"sampling": {"group_size": 4}}, tags=["clone"])
    copy = clone.runs[0]
    assert copy.id != first.id and copy.tags == ["clone"]
    assert copy.config["sampling"]["group_size"] == 4
    assert copy.config["sampling"]["max_new_tokens"] == first.config["sampling"]["max_new_tokens"]

    cancelled = lab.cancel(copy.id)
    assert cancelled.status == "cancelled"

    for run in (*sub.runs, copy):
        lab.delete(run.id)
        with pytest.raises(ApiError) as info:
            lab.get_run(run.id)
        assert info.value.status == 404


def test_validation_error_names_the_field(lab):
    with pytest.raises(ApiError) as info:
        lab.create_runs({"algorithm": "grpo", "sampling": {"group_size": 1}})
    err = info.value
    assert err.status == 422
    fields = [f for f, _ in err.field_errors]
    assert any(f.endswith("sampling.group_size") for f in fields), fields
    assert "sampling.group_size" in str(err)

    with pytest.raises(ApiError) as info:
        lab.create_runs({"algorithm": "nope"})
    assert info.value.status == 422 and "algorithm" in str(info.value)


def test_mutations_need_a_token(lab_server, no_ambient_credentials):
    with Client(lab_server.url, token=None) as anonymous:
        assert anonymous.token is None
        anonymous.list_runs(limit=1)  # reads are open by default
        with pytest.raises(ApiError) as info:
            anonymous.create_runs(small_config())
    assert info.value.status in (401, 403)


def test_external_run_metrics_compare_and_rollouts(lab):
    run = lab.create_external_run("ext", {"lr": 1e-6}, "trl-grpo", "arith", "tiny", ["ext"], 3)
    assert run.status == "running" and run.external
    written = log_points(lab, run.id, range(1, 4))
    assert written == 9
    lab.log_steps(
        run.id,
        [{"step": 3, "metrics": {"loss": math.nan}}],
        rollouts=[
            {
                "step": 3,
                "group": 0,
                "index": i,
                "reward": float(i % 2),
                "score": -0.5 * i,
                "length": 4,
                "truncated": False,
            }
            for i in range(4)
        ],
        status="succeeded",
    )
    assert lab.metric_keys(run.id) == ["batch/pass_rate", "loss", "sep/gap"]
    series = lab.metrics(run.id, ["sep/gap", "loss"])
    assert series["sep/gap"].steps == [1, 2, 3]
    assert series["sep/gap"].values == pytest.approx([0.1, 0.2, 0.3])
    assert series["loss"].values[-1] is None  # NaN is stored as null
    assert lab.metrics(run.id, ["sep/gap"], since_step=2)["sep/gap"].steps == [3]

    other = lab.create_external_run("ext2", {}, "trl-grpo", "arith", "tiny", [], 2)
    log_points(lab, other.id, range(1, 3), status="succeeded")
    both = lab.compare([run.id, other.id], ["sep/gap"])
    assert set(both) == {run.id, other.id}
    assert both[other.id]["sep/gap"].steps == [1, 2]

    rows = lab.rollouts(run.id)
    assert len(rows) == 4 and {r.reward for r in rows} == {0.0, 1.0}
    final = lab.get_run(run.id)
    assert final.status == "succeeded" and final.step == 3
    assert final.summary["sep/gap"] == pytest.approx(0.3)


def test_watch_yields_live_events_and_ends(lab):
    run = lab.create_external_run("live", {}, "trl-grpo", "arith", "tiny", [], 4)

    def feed() -> None:
        for step in range(1, 5):
            time.sleep(0.3)
            log_points(lab, run.id, range(step, step + 1))
        lab.log_steps(run.id, [], status="succeeded")

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        events = list(lab.watch(run.id))
    finally:
        feeder.join()
    assert events[-1].event == "end"
    steps = sorted(
        s for e in events if e.event == "metrics" for s in e.data["series"]["sep/gap"]["steps"]
    )
    assert steps == [1, 2, 3, 4]
    statuses = [e.run.status for e in events if e.event == "status"]
    assert statuses and statuses[-1] == "succeeded"


class DropFirstStream(httpx.BaseTransport):
    """Cuts the first SSE connection after its first metrics event, as a flaky proxy would."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.stream_requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not request.url.path.endswith("/stream"):
            return response
        self.stream_requests.append(request)
        if len(self.stream_requests) > 1:
            return response

        class Cut(httpx.SyncByteStream):
            def __iter__(self):
                buf = b""
                for chunk in response.stream:
                    buf += chunk.replace(b"\r\n", b"\n")
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        yield event + b"\n\n"
                        if b"event: metrics" in event:
                            raise httpx.ReadError("connection dropped")

            def close(self):
                response.close()

        return httpx.Response(
            response.status_code, headers=response.headers, stream=Cut(), request=request
        )


def test_watch_reconnects_from_the_last_event_id(lab_server, lab):
    run = lab.create_external_run("flaky", {}, "trl-grpo", "arith", "tiny", [], 6)
    log_points(lab, run.id, range(1, 4))
    transport = DropFirstStream()
    with lab_server.client(transport=transport) as flaky:

        def finish() -> None:
            time.sleep(0.5)
            log_points(lab, run.id, range(4, 7), status="succeeded")

        feeder = threading.Thread(target=finish)
        feeder.start()
        try:
            events = list(flaky.watch(run.id, retry_wait=0.1))
        finally:
            feeder.join()
    assert len(transport.stream_requests) >= 2
    resumed = transport.stream_requests[1]
    first_id = next(e.id for e in events if e.event == "metrics")
    assert resumed.headers.get("last-event-id") == first_id
    steps = [
        s for e in events if e.event == "metrics" for s in e.data["series"]["sep/gap"]["steps"]
    ]
    assert sorted(steps) == list(range(1, 7)) and len(steps) == len(set(steps))
    assert events[-1].event == "end"
