"""A real ConSPO Lab server, a real worker and a real Chromium for the web UI tests.

One session: a fresh SQLite database in a tmp dir (migrated with ``conspo-lab migrate``), an admin
token (``conspo-lab token create``) written where embedded mode keeps it so the pages get it
injected (``CONSPO_UI_TOKEN_INJECT=true``), uvicorn serving ``backend.main:create_app`` on a port
in 18200-18299, and ``conspo-lab worker`` (the Celery worker) when that command exists. Chromium
is Debian's ``/usr/bin/chromium`` driven by Playwright's sync API.

Without a backend or a browser the tests skip, unless CONSPO_REQUIRE_SERVICES=1 (CI), where they
fail. ``CONSPO_UI_TEST_URL`` (with ``CONSPO_UI_TEST_TOKEN``, ``CONSPO_UI_TEST_WORKER=1``) points
the tests at a server that is already running instead. Every page collects console errors and
uncaught exceptions; a test fails on any of them, and on any request that leaves the server (the
UI must work offline).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from conspo_lab.cli_server import EmbeddedWorker
from tests.support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    ROOT,
    StackUnavailable,
    embedded_env,
    migrate_and_create_token,
    start_api,
    stop,
)
from tests.support import (
    REQUIRE_SERVICES as REQUIRE,
)

PORTS = range(18200, 18300)
SCREENSHOTS = ROOT / "artifacts" / "screenshots"


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"CONSPO_REQUIRE_SERVICES=1 but the UI test stack is unavailable: {reason}")
    pytest.skip(f"UI test stack unavailable: {reason}")


# ------------------------------------------------------------------------------------------------
# server + worker
# ------------------------------------------------------------------------------------------------


@dataclass
class UIServer:
    url: str
    token: str
    data_dir: Path
    has_worker: bool
    http: httpx.Client = field(repr=False)
    model_root: Path | None = None  # where the worker may load local model directories from

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self.http.request(method, path, **kwargs)
        assert resp.status_code < 400, f"{method} {path} → {resp.status_code}: {resp.text[:500]}"
        return resp.json() if resp.content else None

    def stop_run(self, run_id: int) -> None:
        """Cancel a run a test is done with, so the worker is free for the next test; a run
        that finished first (a 409) is as good, on a machine fast enough to finish it."""
        resp = self.http.post(f"/api/runs/{run_id}/cancel")
        if resp.status_code == 409:
            state = self.api("GET", f"/api/runs/{run_id}")["status"]
            assert state in {"succeeded", "failed", "cancelled"}, f"run {run_id}: {resp.text}"
            return
        assert resp.status_code < 400, f"cancel run {run_id} → {resp.status_code}: {resp.text}"

    def external_run(
        self,
        name: str,
        config: dict[str, Any],
        *,
        tags: list[str] | None = None,
        total_steps: int = 100,
        algorithm: str = "conspo",
    ) -> dict[str, Any]:
        body = {
            "name": name,
            "config": config,
            "algorithm": algorithm,
            "task": "arith",
            "model": "tiny",
            "tags": tags or [],
            "total_steps": total_steps,
        }
        return self.api("POST", "/api/runs/external", json=body)

    def log(
        self,
        run_id: int,
        steps: range | list[int],
        *,
        offset: float = 0.0,
        status: str | None = None,
        rollouts: bool = True,
    ) -> None:
        """Log synthetic steps over HTTP, the way an external trainer would."""
        body: dict[str, Any] = {
            "steps": [{"step": s, "metrics": fake_metrics(s, offset)} for s in steps],
            "rollouts": [r for s in steps for r in fake_rollouts(s)] if rollouts else [],
        }
        if status:
            body["status"] = status
        self.api("POST", f"/api/runs/{run_id}/log", json=body)


def fake_metrics(step: int, offset: float = 0.0) -> dict[str, float]:
    rng = random.Random(step * 7919 + int(offset * 1000))
    x = step / 50
    gap = 0.4 * (1 - 2.718 ** (-3 * x)) + offset + rng.gauss(0, 0.02)
    pos = -1.0 + gap / 2
    return {
        "sep/pos_score": pos,
        "sep/neg_score": pos - gap,
        "sep/gap": gap,
        "sep/gap_min": gap - 0.5,
        "sep/order_acc": min(1.0, 0.5 + 0.4 * x),
        "sep/margin_acc": min(1.0, 0.45 + 0.4 * x),
        "conspo/margin": 0.01 * min(1.0, x / 0.3),
        "batch/pass_rate": min(1.0, 0.3 + 0.5 * x),
        "batch/valid_groups": 10 - 4 * x,
        "batch/all_pos_groups": 1 + 5 * x,
        "batch/all_neg_groups": 5 - x,
        "len/pos": 5 + rng.random(),
        "len/neg": 7 + rng.random(),
        "optim/loss": 1 / (1 + step) + 0.05 * rng.random(),
        "optim/grad_norm": 0.5 + rng.random(),
        "policy/entropy": 2 - x,
        "optim/lr": 3e-5 * min(1.0, step / 10),
        "grpo/clip_frac": 0.1 * rng.random(),
        "rollouts/seen": step * 64.0,
        **({"eval/accuracy": 0.2 + 0.5 * x, "eval/pass@k": 0.4 + 0.4 * x} if step % 5 == 0 else {}),
    }


def fake_rollouts(step: int) -> list[dict[str, Any]]:
    rng = random.Random(step)
    rows = []
    for g in range(4):
        for i in range(4):
            reward = 1.0 if rng.random() < 0.5 else 0.0
            score = (-0.9 if reward else -1.2) + rng.gauss(0, 0.1)
            rows.append(
                {
                    "step": step,
                    "group": g,
                    "index": i,
                    "reward": reward,
                    "score": score,
                    "length": 6,
                    "truncated": False,
                }
            )
    return rows


def _start_worker(env: dict[str, str], log: Path) -> EmbeddedWorker:
    """The worker, restarted when it dies, as ``serve --embedded`` keeps its own: a run's
    watchdog kills a worker that does not honour a cancel in time (a cancel while it still
    builds a model, say), and the module's later tests need one."""
    worker = EmbeddedWorker(env=env, cwd=Path(env["CONSPO_DATA_DIR"]), log=log)
    worker.start()
    return worker


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UIServer]:
    existing = os.environ.get("CONSPO_UI_TEST_URL")  # point the tests at a running server
    if existing:
        token = os.environ.get("CONSPO_UI_TEST_TOKEN", "")
        http = httpx.Client(
            base_url=existing,
            timeout=30,
            headers={"Authorization": f"Bearer {token}"} if token else {},
        )
        with http:
            yield UIServer(
                url=existing,
                token=token,
                data_dir=Path("."),
                http=http,
                has_worker=os.environ.get("CONSPO_UI_TEST_WORKER") == "1",
            )
        return
    try:
        from backend.main import create_app  # noqa: F401
    except Exception as exc:  # not written yet, or broken
        _unavailable(f"cannot import backend.main.create_app: {exc!r}")
    data = tmp_path_factory.mktemp("ui-server")
    model_root = data / "local-models"  # users' checkpoint directories (test_real_checkpoint)
    model_root.mkdir()
    env = embedded_env(
        data,
        CONSPO_UI_TOKEN_INJECT="true",
        CONSPO_HEARTBEAT_INTERVAL_S="0.5",
        CONSPO_MODEL_ROOTS=str(model_root),
        # test_alerts' webhook receiver listens on this machine's loopback
        CONSPO_ALERT_ALLOW_PRIVATE="true",
        CONSPO_ALERT_POLL_S="0.5",
    )
    try:
        token = migrate_and_create_token(env, "ui-tester")
        (data / "token").write_text(token + "\n")  # where embedded mode keeps the UI's token
        api, url = start_api(env, data / "server.log", PORTS)
    except StackUnavailable as exc:
        _unavailable(str(exc))
    worker = _start_worker(env, data / "worker.log")
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    try:
        yield UIServer(
            url=url, token=token, data_dir=data, has_worker=True, http=http, model_root=model_root
        )
    finally:
        http.close()
        worker.stop()
        stop(api, timeout=15)


# ------------------------------------------------------------------------------------------------
# browser
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable(f"playwright is not installed: {exc}")
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        _unavailable(f"Chromium not found at {CHROMIUM}")
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # noqa: BLE001 - any launch failure means no browser
            _unavailable(f"Chromium did not start: {exc}")
        yield browser
        browser.close()


class PageProblems:
    """Console errors, uncaught exceptions and off-host requests seen by one page."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.page_errors: list[str] = []
        self.console: list[tuple[str, str, Any]] = []  # (text, url, location) of console errors
        self.external: list[str] = []
        self.allowed: list[tuple[str, str]] = []

    def allow_http_error(self, status: int, path: str) -> None:
        """Tolerate Chromium's network log line for one expected error response (e.g. a 422);
        a ``path`` without a query string covers every query of that path."""
        self.allowed.append((f"status of {status}", f"{self.host}{path}"))

    def attach(self, page: Any) -> None:
        page.on("console", self._console)
        page.on("response", self._response)
        page.on("pageerror", lambda exc: self.page_errors.append(f"pageerror: {exc}"))
        page.route("**/*", self._route)

    def _response(self, response: Any) -> None:
        # A 503 with Retry-After is the server's back-pressure on a loaded machine, which the
        # page's client waits out and asks again (frontend/static/api.js): Chromium still logs
        # it, and that line is no fault of the page. A 503 without it stays an error.
        if response.status == 503 and response.headers.get("retry-after") is not None:
            self.allowed.append(("status of 503", response.url))

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            location = msg.location or {}
            self.console.append((msg.text, location.get("url", ""), location))

    @property
    def errors(self) -> list[str]:
        """Uncaught exceptions and console errors, less the allowed ones (judged when asked:
        a response's event may reach us after Chromium's log line about it)."""
        return self.page_errors + [
            f"console.error: {text} @ {location}"
            for text, url, location in self.console
            if not any(
                allowed in text
                and (url == where or ("?" not in where and url.split("?")[0] == where))
                for allowed, where in self.allowed
            )
        ]

    def _route(self, route: Any) -> None:
        url = route.request.url
        if url.startswith(self.host) or url.startswith("data:") or url.startswith("blob:"):
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def check(self) -> None:
        assert not self.errors, "browser console errors:\n" + "\n".join(self.errors)
        assert not self.external, "requests left the server (UI must work offline):\n" + "\n".join(
            self.external
        )


@pytest.fixture
def page(browser: Any, ui_server: UIServer) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(60_000)  # a loaded CI box: conditions, not timings, decide
    problems = PageProblems(ui_server.url)
    problems.attach(pg)
    pg.problems = problems
    try:
        yield pg
        problems.check()
    finally:
        context.close()


@pytest.fixture
def shot() -> Callable[[Any, str], Path]:
    """shot(page, name): a full-page screenshot to artifacts/screenshots/<name>.png."""

    def take(page: Any, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        page.evaluate("window.scrollTo(0, 0)")  # sticky headers draw at the scroll position
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@contextmanager
def offline_report(browser: Any, report: Path) -> Iterator[Any]:
    """A page of a fresh browser context with the self-contained report at ``report`` opened
    from file://. On leaving: it asked for nothing but its own file and raised no error."""
    context = browser.new_context()
    try:
        page = context.new_page()
        requests: list[str] = []
        errors: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(report.as_uri())
        yield page
        assert [u for u in requests if u != report.as_uri()] == []
        assert errors == []
    finally:
        context.close()
