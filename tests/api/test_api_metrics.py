"""External logging, metric series (downsampling keeps min/max), compare, rollouts, live SSE."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from conspo.metrics import catalogue
from tests.api.conftest import Api


def log(api: Api, run_id: int, steps: list[dict], **extra) -> dict:  # type: ignore[no-untyped-def]
    r = api.post(f"/api/runs/{run_id}/log", json={"steps": steps, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def wave(n: int, spike_at: int) -> list[dict]:
    return [
        {
            "step": i,
            "metrics": {"a": math.sin(i / 50) + (10.0 if i == spike_at else 0.0), "b": float(i)},
            "wall_time": 1_700_000_000.0 + i,
        }
        for i in range(1, n + 1)
    ]


def test_downsampling_keeps_min_max_and_says_so(api: Api) -> None:
    run = api.external(total_steps=3000)
    assert log(api, run["id"], wave(3000, spike_at=1234))["written"] == 6000
    url = f"/api/runs/{run['id']}/metrics"
    for _ in range(2):  # cold, then from the rollup cache
        series = api.get(url, params={"keys": "a,b,missing", "max_points": 100}).json()["series"]
        a = series["a"]
        assert a["sampled"] is True and a["total_points"] == 3000
        assert 50 <= len(a["steps"]) <= 100
        assert max(a["max"]) == max(s["metrics"]["a"] for s in wave(3000, 1234))  # spike kept
        assert min(a["min"]) <= -0.99
        assert a["steps"] == sorted(a["steps"]) and a["steps"][-1] == 3000
        assert all(lo <= v <= hi for lo, v, hi in zip(a["min"], a["values"], a["max"], strict=True))
        assert series["b"]["max"][-1] == 3000.0
        assert series["missing"] == {
            "steps": [], "values": [], "min": [], "max": [], "wall_time": [],
            "sampled": False, "total_points": 0,
        }  # fmt: skip
    full = api.get(url, params={"keys": "a", "max_points": 10000}).json()["series"]["a"]
    assert full["sampled"] is False and full["steps"] == list(range(1, 3001))
    assert full["wall_time"][0] == 1_700_000_001.0
    tail = api.get(url, params={"keys": "a", "since_step": 2990}).json()["series"]["a"]
    assert tail["steps"] == list(range(2991, 3001)) and tail["total_points"] == 10
    # Overwrites are idempotent and invalidate cached buckets.
    log(api, run["id"], [{"step": 10, "metrics": {"a": -50.0}}])
    again = api.get(url, params={"keys": "a", "max_points": 100}).json()["series"]["a"]
    assert again["total_points"] == 3000 and min(again["min"]) == -50.0
    keys = api.get(f"/api/runs/{run['id']}/metrics/keys").json()
    assert keys == {"keys": ["a", "b"]}


def test_nan_inf_stored_as_null_and_summary(api: Api) -> None:
    run = api.external()
    body = '{"steps": [{"step": 1, "metrics": {"x": NaN, "y": Infinity, "z": 2.5}}]}'
    r = api.post(
        f"/api/runs/{run['id']}/log", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200, r.text
    s = api.get(f"/api/runs/{run['id']}/metrics", params={"keys": "x,y,z"}).json()["series"]
    assert s["x"]["values"] == [None] and s["y"]["values"] == [None] and s["z"]["values"] == [2.5]
    got = api.get(f"/api/runs/{run['id']}").json()
    assert got["summary"] == {"x": None, "y": None, "z": 2.5} and got["step"] == 1


def test_compare_and_rollouts(api: Api) -> None:
    one, two = api.external(), api.external()
    log(api, one["id"], wave(50, 7))
    log(api, two["id"], wave(20, 3))
    rollouts = [
        {"step": s, "group": g, "index": i, "reward": float(i % 2), "score": -0.1 * i, "length": 5}
        for s in (1, 2)
        for g in range(2)
        for i in range(4)
    ]
    log(api, one["id"], [], rollouts=rollouts)
    log(api, one["id"], [], rollouts=rollouts)  # idempotent
    r = api.get("/api/compare", params={"runs": f"{one['id']},{two['id']}", "keys": "a,b"})
    assert r.status_code == 200
    runs = r.json()["runs"]
    assert set(runs) == {str(one["id"]), str(two["id"])}
    assert runs[str(two["id"])]["series"]["b"]["steps"] == list(range(1, 21))
    items = api.get(f"/api/runs/{one['id']}/rollouts", params={"step_min": 2}).json()["items"]
    assert len(items) == 8 and {x["step"] for x in items} == {2}
    assert items[1] == {
        "step": 2, "group": 0, "index": 1, "reward": 1.0, "score": -0.1, "length": 5,
        "truncated": False,
    }  # fmt: skip
    assert api.get("/api/compare", params={"runs": "999999", "keys": "a"}).status_code == 404


def test_bad_metric_queries_name_the_field(api: Api) -> None:
    run = api.external()
    url = f"/api/runs/{run['id']}/metrics"
    for params, loc in [
        ({}, ["query", "keys"]),
        ({"keys": ","}, ["query", "keys"]),
        ({"keys": "a", "max_points": 1}, ["query", "max_points"]),
        ({"keys": "a", "max_points": 10001}, ["query", "max_points"]),
        ({"keys": "a", "since_step": "x"}, ["query", "since_step"]),
        ({"keys": "a", "x": "time"}, ["query", "x"]),
    ]:
        r = api.get(url, params=params)
        assert r.status_code == 422 and loc in [d["loc"] for d in r.json()["detail"]], params
    for params, loc in [
        ({"runs": "1,x", "keys": "a"}, ["query", "runs"]),
        ({"runs": ",".join(map(str, range(1, 52))), "keys": "a"}, ["query", "runs"]),
        ({"runs": "1", "keys": ",".join(f"k{i}" for i in range(51))}, ["query", "keys"]),
    ]:
        r = api.get("/api/compare", params=params)
        assert r.status_code == 422 and loc in [d["loc"] for d in r.json()["detail"]], params
    too_many = [{"step": i, "metrics": {"a": 1.0, "b": 2.0}} for i in range(5001)]
    r = api.post(f"/api/runs/{run['id']}/log", json={"steps": too_many})
    assert r.status_code == 422 and ["body", "steps"] in [d["loc"] for d in r.json()["detail"]]
    r = api.post(f"/api/runs/{run['id']}/log", json={"steps": [{"step": -1, "metrics": {}}]})
    assert r.status_code == 422
    queued = api.post("/api/runs", json={"config": {"steps": 2}}).json()["runs"][0]
    assert api.post(f"/api/runs/{queued['id']}/log", json={"steps": []}).status_code == 409


def read_sse(api: Api, url: str, stop: str = "end", **kw) -> list[tuple[str, str, dict]]:  # type: ignore[no-untyped-def]
    """Events up to the first ``stop`` event (``end`` by default)."""
    events, event, eid, data = [], None, None, None
    with api.client.stream("GET", url, **kw) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("id:"):
                eid = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data = json.loads(line.split(":", 1)[1])
            elif line == "" and event:
                events.append((event, eid, data))
                if event in (stop, "end"):
                    break
                event = None
    return events


def streamed(events: list, key: str) -> list[int]:  # type: ignore[type-arg]
    return [
        s for e in events if e[0] == "metrics" for s in e[2]["series"].get(key, {}).get("steps", [])
    ]


def test_run_stream_sends_points_status_and_end_and_resumes(api: Api) -> None:
    run = api.external()
    log(api, run["id"], wave(30, 5), status="succeeded")
    events = read_sse(api, f"/api/runs/{run['id']}/stream")
    kinds = [e[0] for e in events]
    assert kinds[0] == "metrics" and "status" in kinds and kinds[-1] == "end"
    steps = [s for e in events if e[0] == "metrics" for s in e[2]["series"]["a"]["steps"]]
    assert steps == list(range(1, 31)) and events[-1][2]["step_max"] == 30
    status = next(e for e in events if e[0] == "status")[2]
    assert status["status"] == "succeeded"
    resumed = read_sse(
        api, f"/api/runs/{run['id']}/stream", headers={"Last-Event-ID": events[-1][1]}
    )
    assert [e[0] for e in resumed] == ["status", "end"]  # the cursor had seen every write
    by_step = read_sse(api, f"/api/runs/{run['id']}/stream", params={"since_step": 25})
    assert streamed(by_step, "b") == [26, 27, 28, 29, 30]
    by_cursor = read_sse(api, f"/api/runs/{run['id']}/stream", params={"since_step": 30})
    assert [e[0] for e in by_cursor] == ["status", "end"]


def test_stream_sends_keys_written_later_to_a_step_already_sent(api: Api) -> None:
    """The cursor is the write sequence: an eval metric (or a TRL summary) logged after a step's
    training metrics is streamed, on the open connection and after a reconnect, exactly once."""
    run = api.external()
    url = f"/api/runs/{run['id']}/stream"
    log(api, run["id"], [{"step": s, "metrics": {"loss": float(s)}} for s in (1, 2, 3)])
    first = read_sse(api, url, stop="metrics")
    assert streamed(first, "loss") == [1, 2, 3]
    cursor = first[-1][1]
    log(api, run["id"], [{"step": 3, "metrics": {"eval/accuracy": 0.5}}])  # late, at a sent step
    log(api, run["id"], [{"step": 2, "metrics": {"eval/accuracy": 0.25}}])  # later, further back
    log(api, run["id"], [{"step": 4, "metrics": {"loss": 4.0}}], status="succeeded")
    resumed = read_sse(api, url, headers={"Last-Event-ID": cursor})
    assert sorted(streamed(resumed, "eval/accuracy")) == [2, 3]
    assert streamed(resumed, "loss") == [4]  # nothing already sent comes again
    assert resumed[-1][0] == "end" and resumed[-1][2]["step_max"] == 4
    # Without a cursor every point comes once, each key in step order.
    whole = read_sse(api, url)
    assert streamed(whole, "loss") == [1, 2, 3, 4]
    assert sorted(streamed(whole, "eval/accuracy")) == [2, 3]


def test_stream_since_step_still_sends_later_writes_below_it(api: Api) -> None:
    """``since_step=N`` skips the points at steps <= N that exist when the stream opens (the
    caller loaded them); a point written afterwards at a step <= N is still sent."""
    run = api.external()
    url = f"/api/runs/{run['id']}/stream"
    log(api, run["id"], [{"step": s, "metrics": {"loss": float(s)}} for s in range(1, 6)])
    opened = read_sse(api, url, stop="status", params={"since_step": 4})
    assert streamed(opened, "loss") == [5]
    log(api, run["id"], [{"step": 3, "metrics": {"eval/accuracy": 0.75}}])
    log(api, run["id"], [{"step": 6, "metrics": {"loss": 6.0}}], status="succeeded")
    # A reconnect keeps its URL (since_step) and sends the last id, as EventSource does.
    resumed = read_sse(api, url, params={"since_step": 4}, headers={"Last-Event-ID": opened[-1][1]})
    assert streamed(resumed, "eval/accuracy") == [3] and streamed(resumed, "loss") == [6]


def test_stream_chunks_keep_whole_writes_and_resume_from_any_event(api: Api) -> None:
    from backend.db import Database
    from backend.storage.stream import StreamCursor, query_new_points

    run = api.external()
    for start in range(1, 40, 4):  # ten writes of 4 steps x 2 keys
        log(
            api,
            run["id"],
            [{"step": s, "metrics": {"a": 1.0, "b": 2.0}} for s in range(start, start + 4)],
        )
    log(api, run["id"], [{"step": 2, "metrics": {"c": 3.0}}])
    db = Database(api.settings)
    try:
        with db.session() as session:
            seen: list[tuple[str, int]] = []
            cursor, events = StreamCursor(), 0
            while True:
                got = query_new_points(session, run["id"], cursor, limit_rows=10)
                cursor, series = got.cursor, got.series
                if not series:
                    break
                events += 1
                chunk = [(k, st) for k, s in series.items() for st in s.steps]
                assert len(chunk) <= 10 and len(chunk) % 8 in (0, 1)  # whole writes only
                seen += chunk
                assert StreamCursor.parse(cursor.event_id, None) == cursor
            assert sorted(seen) == sorted({(k, st) for k, st in seen}) and len(seen) == 81
            assert events == 10  # the last write (1 point) fits beside the tenth (8)
            # A single write larger than the limit comes whole.
            series = query_new_points(session, run["id"], StreamCursor(), limit_rows=3).series
            assert sum(len(s.steps) for s in series.values()) == 8
            # A backlog cursor: steps <= 36 written before it opened are skipped.
            seq = session.scalar(text_seq(run["id"]))
            backlog = StreamCursor(since_step=36, backlog_until=seq)
            got = query_new_points(session, run["id"], backlog, limit_rows=100)
            assert {k: s.steps for k, s in got.series.items()} == {
                "a": [37, 38, 39, 40],
                "b": [37, 38, 39, 40],
            }
            assert got.cursor == StreamCursor(seq, 36, None) and got.cursor.event_id == str(seq)
    finally:
        db.dispose()


def text_seq(run_id: int):  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from backend.models import Run

    return select(Run.write_seq).where(Run.id == run_id)


def test_step_max_pages_raw_points(api: Api) -> None:
    run = api.external(total_steps=3000)
    log(api, run["id"], wave(3000, spike_at=1234))
    url = f"/api/runs/{run['id']}/metrics"
    pages: list[int] = []
    cursor = 0
    while cursor < 3000:  # pages of 700 steps with max_points=700: never bucketed
        page = api.get(
            url,
            params={"keys": "a", "max_points": 700, "since_step": cursor, "step_max": cursor + 700},
        ).json()["series"]["a"]
        assert page["sampled"] is False and len(page["steps"]) <= 700
        pages += page["steps"]
        cursor += 700
    assert pages == list(range(1, 3001))
    # step_max alone bounds a bucketed series too, and the rollup cache still answers right.
    for _ in range(2):
        head = api.get(url, params={"keys": "a,b", "max_points": 100, "step_max": 2000}).json()
        b = head["series"]["b"]
        assert b["sampled"] is True and b["total_points"] == 2000 and b["steps"][-1] == 2000
        assert max(b["max"]) == 2000.0 and max(head["series"]["a"]["max"]) > 9  # spike kept
    r = api.get(url, params={"keys": "a", "step_max": "x"})
    assert r.status_code == 422 and ["query", "step_max"] in [d["loc"] for d in r.json()["detail"]]


def test_catalogue_is_served_and_injected_into_pages(api: Api) -> None:
    served = api.get("/api/metrics/catalogue").json()
    assert served == json.loads(json.dumps(asdict(catalogue())))
    assert {"sep/gap", "optim/loss", "grpo/clip_frac"} <= {m["key"] for m in served["metrics"]}
    page = api.get("/").text
    assert "window.CONSPO_CATALOGUE = {" in page and '"key": "sep/gap"' in page


def test_series_reads_are_cached_until_the_next_write_and_never_cross_runs(api: Api) -> None:
    """The API keeps the series it built (``backend.storage.series.SERIES_CACHE``): a repeated
    read sends no point query, a write makes the next read fresh, and a run given a deleted
    run's id (SQLite reuses the last one) never gets the other's series."""
    from sqlalchemy import event

    engine = api.client.app.state.db.engine
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    def read(run_id: int, keys: str = "a") -> tuple[dict, int]:  # type: ignore[type-arg]
        statements.clear()
        r = api.get(f"/api/runs/{run_id}/metrics", params={"keys": keys})
        assert r.status_code == 200, r.text
        return r.json()["series"], len(statements)

    run = api.external()
    log(api, run["id"], [{"step": i, "metrics": {"a": float(i)}} for i in range(1, 4)])
    event.listen(engine, "before_cursor_execute", count)
    try:
        first, cold = read(run["id"])
        again, warm = read(run["id"])
        assert again == first and first["a"]["steps"] == [1, 2, 3]
        assert warm < cold, (warm, cold)  # the run and its write sequence, no points
        log(api, run["id"], [{"step": 4, "metrics": {"a": 4.0}}])
        assert read(run["id"])[0]["a"]["steps"] == [1, 2, 3, 4]
    finally:
        event.remove(engine, "before_cursor_execute", count)
    last = api.external()
    log(api, last["id"], [{"step": 1, "metrics": {"a": 1.0}}])
    assert read(last["id"])[0]["a"]["values"] == [1.0]
    assert api.delete(f"/api/runs/{last['id']}").status_code == 204
    reborn = api.external()
    log(api, reborn["id"], [{"step": 1, "metrics": {"a": 2.0}}])
    assert read(reborn["id"])[0]["a"]["values"] == [2.0]
