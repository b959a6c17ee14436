"""The run's log (worker/run_log.py, backend/storage/run_logs.py, GET /api/runs/{id}/log).

A capture around real output — print(), raw writes to fds 1 and 2, a child process, a logging
warning, 20 MB printed as fast as Python can — against the real database: every line in order,
bounded with the head and the tail kept and the cut said, the secrets the worker knows never
stored; read with ``since`` as a page following it live would, resuming after a reconnect. Then a
real worker attempt that fails: its traceback in its log."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from backend.db import Database
from backend.storage import run_logs
from tests.api.conftest import Api, tiny_config, wait_for
from worker.run_log import Redactor, RunLogCapture, secrets_of

pytestmark = pytest.mark.services


def external_run(api: Api) -> int:
    return api.external(name=f"log-{uuid.uuid4().hex[:6]}")["id"]


def read_all(api: Api, run_id: int, since: int = 0) -> tuple[str, int]:
    text, chunks = "", 0
    while True:
        r = api.get(f"/api/runs/{run_id}/log", params={"since": since, "limit": 50})
        assert r.status_code == 200, r.text
        body = r.json()
        if not body["chunks"]:
            return text, since
        seqs = [c["seq"] for c in body["chunks"]]
        assert seqs == sorted(seqs) and seqs[0] > since  # in order, never twice
        text += "".join(c["text"] for c in body["chunks"])
        since = body["next"]
        chunks += len(seqs)


def test_everything_the_process_prints_is_captured_in_order_and_redacted(
    api: Api, tmp_path: Path
) -> None:
    run_id = external_run(api)
    db = Database(api.settings)
    token = "ghp_" + uuid.uuid4().hex
    os.environ["CONSPO_TEST_LOG_TOKEN"] = token
    password_url = "postgresql://alice:s3cr3t-pw@db.internal:5432/conspo"
    try:
        capture = RunLogCapture(db, run_id, 1, tmp_path / "attempt-1.txt",
                                Redactor(secrets_of(api.settings)), interval_s=0.2)  # fmt: skip
        with capture:
            print("line 1 from print()", flush=True)
            os.write(1, b"line 2 from fd 1\n")
            os.write(2, b"line 3 from fd 2\n")
            subprocess.run([sys.executable, "-c", "print('line 4 from a child process')"],
                           check=True)  # fmt: skip
            handler = logging.StreamHandler(sys.stderr)  # as a worker's logging writes
            logging.getLogger("conspo.test").addHandler(handler)
            logging.getLogger("conspo.test").warning("line 5 from logging")
            logging.getLogger("conspo.test").removeHandler(handler)
            print(f"secret token {token} and Authorization: Bearer abcdef1234567890xyz", flush=True)
            print(f"connecting to {password_url} and {api.settings.database_url}", flush=True)
            print("hf token hf_abcdefghijklmnopqrstuvwx; password=hunter22", flush=True)
            print("no newline at the end", end="", flush=True)
        text, _ = read_all(api, run_id)
    finally:
        os.environ.pop("CONSPO_TEST_LOG_TOKEN", None)
        db.dispose()
    order = [text.index(f"line {i}") for i in (1, 2, 3, 4, 5)]
    assert order == sorted(order), text
    for secret in (token, "s3cr3t-pw", "abcdef1234567890xyz", "hf_abcdefghijklmnopqrstuvwx",
                   "hunter22"):  # fmt: skip
        assert secret not in text, secret
    if "@" in api.settings.database_url or "://" in api.settings.database_url:
        assert api.settings.database_url not in text
    assert "postgresql://alice:***@db.internal" in text
    assert text.endswith("no newline at the end\n")


def test_a_progress_bar_reaches_the_log_while_it_redraws(api: Api, tmp_path: Path) -> None:
    """tqdm redraws one line after each carriage return and ends it with a newline only when
    done: held back to a newline, the Logs tab would show no progress until the bar ended."""
    run_id = external_run(api)
    db = Database(api.settings)
    try:
        capture = RunLogCapture(db, run_id, 1, tmp_path / "attempt-1.txt",
                                Redactor([]), interval_s=0.2)  # fmt: skip
        with capture:
            os.write(2, b"\rsteps:   0%|          | 0/3\rsteps:  33%|###       | 1/3\r")

            def redrawn() -> str | None:
                text, _ = read_all(api, run_id)
                return text if "1/3" in text else None

            text = wait_for(redrawn, 60, "the bar's redraws in the log while it runs")
            os.write(2, b"steps: 100%|##########| 3/3\n")
        assert "0/3\r" in text and "1/3\r" in text
        final, _ = read_all(api, run_id)
    finally:
        db.dispose()
    assert final.endswith("1/3\rsteps: 100%|##########| 3/3\n"), final


def test_a_run_that_prints_fast_keeps_its_head_and_tail_and_says_what_was_cut(
    api: Api, tmp_path: Path
) -> None:
    run_id = external_run(api)
    db = Database(api.settings)
    try:
        seen, since = "", 0
        with RunLogCapture(db, run_id, 1, tmp_path / "fast.txt", Redactor([]), interval_s=0.2):
            out = os.fdopen(os.dup(1), "w", buffering=1 << 16)
            for i in range(200_000):  # ~20 MB
                out.write(f"{i:08d} {'x' * 90}\n")
                if i == 100_000:
                    out.flush()
                    got, since = read_all(api, run_id, since)  # a page reading while it runs
                    seen += got
            out.write("the last line\n")
            out.close()
        got, since = read_all(api, run_id, since)  # ... and resuming where it stopped
        seen += got
        whole, _ = read_all(api, run_id)
        with db.session() as session:
            stored = sum(c.nbytes for c in run_logs.read(session, run_id, 0, 10_000) if not c.cut)
    finally:
        db.dispose()
    assert stored <= run_logs.HEAD_BYTES + run_logs.TAIL_BYTES + 256 * 1024  # + one chunk
    assert whole.startswith("00000000 ")  # the head
    assert whole.rstrip().endswith("the last line")  # the tail
    assert "cut here" in whole or "skipped" in whole  # and what went is said
    lines = [line for line in whole.splitlines() if line[:8].isdigit()]
    numbers = [int(line[:8]) for line in lines]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)  # in order, no twice
    assert "the last line" in seen  # the live reader got to the end too


def test_what_is_written_while_the_log_is_read_survives_its_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast-printing test above once lost its tail under load: a line appended after the
    tailer had measured the file, before it rotated it, went with the rotation. Here a writer
    appends at exactly that moment, at every read: each line is read once, in order, and the
    disk space of what was read is given back all the same."""
    from worker import run_log

    monkeypatch.setattr(run_log, "ROTATE_BYTES", 4096)
    writer = os.open(tmp_path / "attempt.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    written = 0

    def write_a_line() -> None:
        nonlocal written
        os.write(writer, f"{written:06d} {'x' * 92}\n".encode())  # 100 bytes
        written += 1

    class WrittenMeanwhile(type(tmp_path)):  # type: ignore[misc]
        def stat(self, **kwargs: Any) -> os.stat_result:
            measured = super().stat(**kwargs)
            write_a_line()  # the writer goes on, just after the reader measured the file
            return measured

    try:
        for _ in range(50):  # 5,000 bytes: the first read goes past ROTATE_BYTES
            write_a_line()
        path = WrittenMeanwhile(tmp_path / "attempt.txt")
        capture = RunLogCapture(None, 1, 1, path, Redactor([]))  # type: ignore[arg-type]
        read = b"".join(capture._read() for _ in range(4)).decode()
    finally:
        os.close(writer)
    # Each read takes what was there when it measured: all but the line written after the last.
    assert [int(line[:6]) for line in read.splitlines()] == list(range(written - 1))
    on_disk = os.stat(path)
    assert on_disk.st_size == 100 * written and on_disk.st_blocks * 512 < on_disk.st_size


def test_a_failed_run_has_its_traceback_in_its_log(api: Api, workers, model_store: Path) -> None:
    """A real worker process trains a run whose dataset was accepted at submit and is gone when
    the worker reads it: the run fails, and its log holds what the worker printed — the
    traceback — with the last lines served for the failed run's page."""
    root = api.settings.data_dir / "datasets" / f"log-{uuid.uuid4().hex[:6]}"
    root.mkdir(parents=True)
    path = root / "train.jsonl"
    path.write_text("".join(f'{{"prompt": "{i}+{i}=", "answer": "{2 * i}"}}\n' for i in range(20)))
    config = tiny_config(2, task={"name": "jsonl", "params": {"path": str(path)}, "eval_size": 4})
    r = api.post("/api/runs", json={"config": config})
    assert r.status_code == 201, r.text
    run_id = r.json()["runs"][0]["id"]
    path.unlink()  # accepted at submit, gone when the worker reads it
    wp = workers(api.settings, model_store)
    wp.start()

    def ended() -> dict[str, Any] | None:
        run = api.get(f"/api/runs/{run_id}").json()
        return run if run["status"] in {"succeeded", "failed", "cancelled"} else None

    run = wait_for(ended, 300, "the run to end")
    assert run["status"] == "failed", run
    text, _ = read_all(api, run_id)
    assert "Traceback (most recent call last)" in text, (text[-2000:], wp.tail())
    assert "train.jsonl" in text
    tail = api.get(f"/api/runs/{run_id}/log", params={"tail": 5}).json()["lines"]
    assert len(tail) == 5 and any(line.strip() for line in tail)
    for secret in (api.settings.database_url, api.settings.broker_url):
        if "@" in secret:  # a URL with credentials: never in the log
            assert secret not in text


def test_the_log_endpoint_refuses_bad_cursors_and_unknown_runs(api: Api) -> None:
    run_id = external_run(api)
    assert api.get(f"/api/runs/{run_id}/log").json() == {
        "run_id": run_id, "chunks": [], "next": 0, "lines": None}  # fmt: skip
    for params in ({"since": -1}, {"since": "x"}, {"limit": 0}, {"limit": 10_001},
                   {"tail": 0}, {"since": 2**40}):  # fmt: skip
        r = api.get(f"/api/runs/{run_id}/log", params=params)
        assert r.status_code == 422, (params, r.text)
        assert r.json()["detail"][0]["loc"][0] == "query"
    assert api.get("/api/runs/99999999/log").status_code == 404
