"""Server-side commands: serve, worker, migrate, token create (owned by the platform work)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from backend.config import Settings

DEMO_SEEDS = [0, 1, 2, 3, 4]
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 60.0)  # waits before successive restarts
STABLE_AFTER_S = 60.0  # a worker that lived this long restarts with the first wait again


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(worker)
    app.command()(migrate)
    token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
    token_app.command("create")(token_create)
    app.add_typer(token_app, name="token")


def serve(
    embedded: Annotated[
        bool,
        typer.Option(
            help="Also run one worker beside the API (SQLite, no services), restarted if it dies."
        ),
    ] = False,
    demo: Annotated[
        bool,
        typer.Option(help="Queue the demo study (GRPO vs ConSPO, 5 seeds) when there are no runs."),
    ] = False,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="API processes. One is GIL-bound to about a core: under heavy reads give it "
            "more (each has its own stream poller and stream bounds).",
        ),
    ] = 1,
) -> None:
    """Migrate the database and serve the API and web UI (with --embedded, a worker too)."""
    import uvicorn

    if embedded:
        os.environ.setdefault("CONSPO_UI_TOKEN_INJECT", "true")
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    from backend.migrate import migrate as run_migrations

    run_migrations(settings.database_url)
    if embedded:
        _ensure_local_token(settings)
    embedded_worker = EmbeddedWorker() if embedded else None
    if embedded_worker is not None:
        embedded_worker.start()
    try:
        if demo:
            _queue_demo(settings)
        typer.echo(f"ConSPO Lab ({settings.mode} mode) on http://{host}:{port}/  API docs: /docs")
        # uvicorn re-raises SIGTERM after its graceful shutdown; with the default handler that
        # would end this process before `finally` stops the embedded worker.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        # X-Forwarded-For only from the configured proxies (uvicorn's default trusts loopback's,
        # which would let any local client pick the address its streams are counted under)
        proxies = ",".join(settings.trusted_proxies)
        uvicorn.run(
            "backend.main:app", host=host, port=port, workers=workers, log_level="info",
            proxy_headers=bool(proxies), forwarded_allow_ips=proxies or None,
        )  # fmt: skip
    finally:
        if embedded_worker is not None:
            embedded_worker.stop()


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


class EmbeddedWorker:
    """The worker process of ``serve --embedded``, restarted whenever it dies.

    A crash (out of memory, a kill, a broken import) would otherwise leave queued runs waiting
    for ever behind a healthy-looking API. Restarts back off (RESTART_BACKOFF_S) so a worker
    that dies at once does not spin, and each one is reported on stderr.
    """

    def __init__(
        self,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        log: Path | None = None,
    ) -> None:
        """``env`` (default: this process's), ``cwd`` and ``log`` (stdout and stderr appended
        there; default: inherited) of every worker process it starts."""
        self._env = env
        self._cwd = cwd
        self._log = log
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._supervise, name="embedded-worker", daemon=True)

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        with self._lock:  # never start one while stop() is ending the last
            if not self._stopping.is_set():
                out = self._log.open("ab") if self._log is not None else None
                try:
                    self._proc = subprocess.Popen(
                        [sys.executable, "-m", "conspo_lab.cli", "worker"],
                        env=self._env if self._env is not None else os.environ.copy(),
                        cwd=self._cwd,
                        stdout=out,
                        stderr=subprocess.STDOUT if out is not None else None,
                    )
                finally:
                    if out is not None:
                        out.close()  # the child holds its own copy

    def _supervise(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            born = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            failures = 1 if time.monotonic() - born >= STABLE_AFTER_S else failures + 1
            wait = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S)) - 1]
            typer.echo(
                f"embedded worker (pid {proc.pid}) exited with code {code}; "
                f"restarting it in {wait:g} s",
                err=True,
            )
            if self._stopping.wait(wait):
                return
            self._spawn()

    def stop(self) -> None:
        """SIGTERM (a warm shutdown waits for the step), SIGKILL after 10 s."""
        with self._lock:
            self._stopping.set()
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def worker(
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info",
) -> None:
    """Run one Celery worker (one run at a time); it also recovers stale runs.

    Concurrency 1, prefetch 1, consuming the queue of every run size this machine can hold
    (gpu, gpu-2 … gpu-N, gpu-ray: its GPUs, CONSPO_WORKER_CPU_PROCESSES without GPUs,
    CONSPO_RAY_ADDRESS)."""
    settings = _settings()
    from worker.capabilities import queues
    from worker.celery_app import celery_app

    celery_app.worker_main(
        [
            "worker",
            "--queues",
            ",".join(queues(settings)),
            "--concurrency",
            "1",
            "--prefetch-multiplier",
            "1",
            "--pool",
            settings.worker_pool,
            "--loglevel",
            loglevel,
            "--without-gossip",
            "--without-mingle",
        ]
    )


def migrate(
    revision: Annotated[
        str, typer.Option(help="head, base (drop everything) or a revision id.")
    ] = "head",
) -> None:
    """Apply (or with --revision base, revert) the Alembic migrations."""
    from backend.migrate import migrate as run_migrations

    settings = _settings()
    run_migrations(settings.database_url, revision)
    typer.echo(f"database at revision {revision}")


def token_create(
    user: Annotated[str, typer.Option(help="User name (created if new).")],
    admin: Annotated[bool, typer.Option(help="Make the user an admin.")] = False,
) -> None:
    """Create an API token and print it once (only its hash is stored).

    The token is stored in the database CONSPO_DATABASE_URL names (default: the embedded SQLite
    under CONSPO_DATA_DIR), so run this where that is the server's database: on a cluster, with
    the same CONSPO_DATABASE_URL as the API (e.g. inside its container)."""
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url

    from backend.db import Database
    from backend.security import create_token

    settings = _settings()
    where = make_url(settings.database_url).render_as_string(hide_password=True)
    db = Database(settings)
    try:
        # A database the server never migrated (a fresh folder's default SQLite, a mistyped URL)
        # has no users table: a token written there would be one the server never reads.
        if not inspect(db.engine).has_table("api_tokens"):
            typer.echo(
                f"{where} holds no ConSPO Lab tables: point CONSPO_DATABASE_URL at the server's"
                " database (or run `conspo-lab migrate` there first)",
                err=True,
            )
            raise typer.Exit(1)
        with db.session() as session:
            token = create_token(session, user, admin=admin, label="cli")
    finally:
        db.dispose()
    typer.echo(token)
    typer.echo(f"token for {user!r} stored in {where}", err=True)


def _settings() -> Settings:
    from backend.config import get_settings

    get_settings.cache_clear()
    return get_settings()


def _ensure_local_token(settings: Settings) -> str:
    """Embedded mode: a local admin whose token lives in data/token (reused while valid)."""
    from backend.db import Database
    from backend.security import create_token, user_for_token

    db = Database(settings)
    try:
        with db.session() as session:
            path = settings.token_file
            if path.is_file():
                existing = path.read_text().strip()
                if existing and user_for_token(session, existing) is not None:
                    return existing
            token = create_token(session, "admin", admin=True, label="embedded")
        path.write_text(token + "\n")
        path.chmod(0o600)
        return token
    finally:
        db.dispose()


def demo_spec() -> dict[str, Any]:
    """The demo study (``make run`` queues it; ``bench/demo_study.py`` runs it headless): its
    base config is ``conspo.demo.DEMO_CONFIG``, the form's defaults."""
    from conspo.demo import DEMO_CONFIG

    return {
        "name": "demo: grpo vs conspo",
        "config": DEMO_CONFIG,
        "arms": [
            {"name": "grpo", "overrides": {"algorithm": "grpo"}},
            {"name": "conspo", "overrides": {"algorithm": "conspo"}},
            {
                "name": "conspo-linear",
                "overrides": {"algorithm": "conspo", "params.contrast": "linear"},
            },
        ],
        "seeds": DEMO_SEEDS,
        "objective": {"metric": "eval/accuracy", "reduce": "mean_last_k", "k": 3},
        "baseline": "grpo",
        "concurrency": 2,
        "tags": ["demo"],
    }


def _queue_demo(settings: Settings) -> None:
    """A study: GRPO vs ConSPO and its linear-contrast ablation, five seeds each, on 1-digit
    a±b±c from the tiny-arith model, two runs queued or running at once (the embedded worker
    trains one; the second waits ready).

    300 steps at the default lr (3e-5) take about a minute a run on a quiet 2-core CPU (65-343 s
    measured, loaded or not): held-out greedy
    accuracy climbs from 0.55 to about 0.7 and the separation curves move, so a newcomer sees
    curves grow; five seeds paired across arms give the study page a verdict worth reading.
    """
    from sqlalchemy import func, select

    from backend.db import Database
    from backend.models import Run
    from backend.runs.lifecycle import LifecycleError
    from backend.runs.queue import JobQueue
    from backend.security import get_or_create_user
    from backend.studies.service import create_study
    from backend.studies.spec import StudyCreate, validate_arm

    spec = StudyCreate.model_validate(demo_spec())
    arms = []
    for arm in spec.arms:
        config, problems = validate_arm(spec.config, arm.overrides, ("demo", arm.name))
        assert config is not None, problems  # the demo's own config: a bug if it is refused
        arms.append((arm.name, config))
    db = Database(settings)
    try:
        with db.session() as session:
            if session.scalar(select(func.count()).select_from(Run)):
                return
            owner = get_or_create_user(session, "admin", admin=True)
            session.commit()
            try:
                study = create_study(session, JobQueue.from_settings(settings), owner, spec, arms)
            except LifecycleError as exc:
                typer.echo(f"could not queue the demo: {exc}", err=True)
                return
            typer.echo(
                f"queued the demo study {study.id}: GRPO vs ConSPO (+ linear ablation), "
                f"{len(DEMO_SEEDS)} seeds each, trained one after another by the embedded "
                f"worker (page: /studies/{study.id})"
            )
    finally:
        db.dispose()
