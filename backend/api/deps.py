"""FastAPI dependencies in one place: database session, settings, the caller, the run in the path.

``RunDep`` resolves ``{run_id}`` or answers 404 once, so handlers never repeat the lookup;
``OwnedRunDep`` adds the ownership rule (the run's owner or an admin, else 403); studies and
pipelines have the same pair, all made by ``found`` and ``owned``.
``SessionDep`` closes when the handler returns, before the response is sent: a slow client, or a
live stream that lasts hours (``RunStreamStart``), holds no connection.

The busiest reads (a run's series, compare, the runs list) take ``InSessionDep`` instead: all
their database work, the encoding of their answer and the session's close in one worker-thread
call. Each sync dependency or handler is a call of its own (plus one to close a session that
began a transaction, and one to check a ``response_model``); on a busy machine every call waits
for a thread to be woken and the event loop to be woken back, each behind the other runnable
processes, so a read made of four calls waited four times as often as one made of one
(``bench/sse_load.py`` splits a read's time into these waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Container, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Concatenate, ParamSpec, Protocol, TypeVar
from weakref import WeakKeyDictionary

import anyio
from celery import Celery
from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from backend.api.stream_hub import StreamHub
from backend.config import Settings
from backend.db import Database
from backend.models import Pipeline, Run, Study, User
from backend.runs.queue import JobQueue
from backend.runs.scheduling import Cluster
from backend.schemas import INT32_MAX
from backend.security import user_for_token
from backend.storage.runs import runs_by_id

bearer = HTTPBearer(auto_error=False, description="An API token from `conspo-lab token create`.")


async def get_database(request: Request) -> Database:
    return request.app.state.db


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


async def get_celery(request: Request) -> Celery:
    return request.app.state.celery


async def get_jobs(request: Request) -> JobQueue:
    return request.app.state.jobs


async def get_stream_hub(request: Request) -> StreamHub:
    return request.app.state.streams


DatabaseDep = Annotated[Database, Depends(get_database)]


class SessionGate:
    """At most ``slots`` requests hold a session at once: ``db_request_concurrency``, and never
    more than the pool has connections for (less the stream hub's). A request takes its slot
    before any of its thread hops, so a request holding a connection never waits behind
    requests that sit in threads waiting for one (with threads and connections both scarce,
    that cycle stalls the API until the pool times out), and few threads run handlers at once
    (many would contend for the GIL with the event loop that serves the streams). A request
    waits ``wait_s`` at most for a slot, then gets the pool's 503.

    Writes (every method but GET and HEAD) hold ``write_slots`` at most, a quarter of the
    slots fewer: trainers logging their steps at the same moment (each write several round
    trips, long on a busy machine) queue among themselves and never leave a read, which is
    short, waiting for all of them (``bench/sse_load.py``: that wait was most of the slowest
    reads' time).
    """

    def __init__(self, slots: int, wait_s: float) -> None:
        self.slots, self.wait_s = max(1, slots), wait_s
        self.write_slots = self.slots - self.slots // 4
        # one pair of semaphores (all, writes) per event loop (tests run several; uvicorn one)
        self._by_loop: WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[anyio.Semaphore, anyio.Semaphore]
        ] = WeakKeyDictionary()

    @classmethod
    def for_settings(cls, settings: Settings) -> SessionGate:
        pool = settings.db_pool_size + settings.db_max_overflow - settings.stream_db_connections
        return cls(min(settings.db_request_concurrency, pool), settings.db_pool_timeout_s)

    @asynccontextmanager
    async def slot(self, write: bool = False) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        semaphores = self._by_loop.get(loop)
        if semaphores is None:
            semaphores = (anyio.Semaphore(self.slots), anyio.Semaphore(self.write_slots))
            self._by_loop[loop] = semaphores
        every, writes = semaphores
        taken: list[anyio.Semaphore] = []
        try:
            with anyio.fail_after(self.wait_s):
                for semaphore in (writes, every) if write else (every,):
                    await semaphore.acquire()
                    taken.append(semaphore)
        except TimeoutError:
            for semaphore in taken:
                semaphore.release()
            raise PoolTimeout(f"no session slot free within {self.wait_s} s") from None
        try:
            yield
        finally:
            for semaphore in taken:
                semaphore.release()


async def get_session(request: Request, db: DatabaseDep) -> AsyncIterator[Session]:
    """The handler's session, closed as soon as the handler has returned (``scope="function"``
    below), not after the response was sent: a slow client must not keep a connection.

    Making a session does no I/O (it connects on its first query, in the handler's thread),
    nor does closing one that never began a transaction; a close that rolls back and returns
    a connection goes to a thread of its own, not one of the pool's the handlers queue for,
    and is shielded: a cancelled request must still give its connection back.
    """
    gate: SessionGate = request.app.state.session_gate
    async with gate.slot(write=request.method not in {"GET", "HEAD"}):
        session = db.sessions()
        try:
            yield session
        finally:
            if session.in_transaction():
                with anyio.CancelScope(shield=True):
                    close = session.close
                    await anyio.to_thread.run_sync(close, limiter=anyio.CapacityLimiter(1))
            else:
                session.close()


SessionDep = Annotated[Session, Depends(get_session, scope="function")]

R = TypeVar("R")
P = ParamSpec("P")


class InSession:
    """Runs ``fn(session, *args)`` in one worker-thread call, in a read session of its own
    (``Database.read_session``: no BEGIN, no ROLLBACK) closed in that same call, under the
    request's session slot (see the module docstring)."""

    def __init__(self, db: Database, gate: SessionGate) -> None:
        self._db, self._gate = db, gate

    async def __call__(
        self, fn: Callable[Concatenate[Session, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        async with self._gate.slot():
            # not abandoned on cancel: a request cut short still closes its session
            return await anyio.to_thread.run_sync(lambda: _in_session(self._db, fn, args, kwargs))


def _in_session(
    db: Database, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> R:
    with db.read_session() as session:
        return fn(session, *args, **kwargs)


async def get_in_session(request: Request, db: DatabaseDep) -> InSession:
    return InSession(db, request.app.state.session_gate)


InSessionDep = Annotated[InSession, Depends(get_in_session)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
CeleryDep = Annotated[Celery, Depends(get_celery)]
JobsDep = Annotated[JobQueue, Depends(get_jobs)]
StreamHubDep = Annotated[StreamHub, Depends(get_stream_hub)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def get_current_user(session: SessionDep, credentials: Credentials) -> User:
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing bearer token (Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    user = user_for_token(session, credentials.credentials)
    if user is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="invalid or revoked token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return user


CurrentUser = Annotated[User, Depends(get_current_user)]


def get_optional_user(session: SessionDep, credentials: Credentials) -> User | None:
    """The caller when the request carries a token (an invalid one is still a 401), else None:
    an open read or check can then say what this caller may do."""
    if credentials is None or not credentials.credentials:
        return None
    return get_current_user(session, credentials)


OptionalUser = Annotated[User | None, Depends(get_optional_user)]


async def require_reader(
    request: Request, settings: SettingsDep, db: DatabaseDep, credentials: Credentials
) -> None:
    """Reads are open unless CONSPO_READS_REQUIRE_TOKEN=true (async: when they are open, as by
    default, every /api request passes here without a thread hop or a session)."""
    if settings.reads_require_token and request.method in {"GET", "HEAD"}:
        await anyio.to_thread.run_sync(check_token, db, credentials)


def check_token(db: Database, credentials: HTTPAuthorizationCredentials | None) -> None:
    """A 401 unless ``credentials`` hold a valid token; its own short read session (nothing
    held while the caller goes on)."""
    with db.read_session() as session:
        get_current_user(session, credentials)


RunId = Annotated[int, Path(ge=1, le=INT32_MAX, description="Run id.")]
StudyId = Annotated[int, Path(ge=1, le=INT32_MAX, description="Study id.")]
PipelineId = Annotated[int, Path(ge=1, le=INT32_MAX, description="Pipeline id.")]


class Owned(Protocol):
    """What the look-up and the ownership rule need of a row (a run, a study, a pipeline)."""

    id: Any
    owner_id: Any
    owner: Any


T = TypeVar("T", bound=Owned)


def found(session: Session, model: type[T], key: int, noun: str) -> T:
    """The ``model`` row ``key``, else 404 ``"<noun> <key> not found"``."""
    thing = session.get(model, key)
    if thing is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"{noun} {key} not found")
    return thing


def owned(thing: T, user: User, noun: str) -> T:
    """``thing`` when ``user`` owns it or is an admin, else 403 naming its owner."""
    if not (user.is_admin or thing.owner_id == user.id):
        owner = thing.owner.name if thing.owner is not None else "nobody"
        detail = f"{noun} {thing.id} belongs to {owner}; only its owner or an admin may change it"
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=detail)
    return thing


def found_runs(session: Session, ids: Sequence[int]) -> list[Run]:
    """The runs ``ids`` in that order, else 404 naming every one that does not exist."""
    found = runs_by_id(session, ids)
    require_runs(ids, found)
    return [found[i] for i in ids]


def require_runs(ids: Sequence[int], found: Container[int]) -> None:
    """404 naming every one of ``ids`` not in ``found``."""
    missing = [i for i in ids if i not in found]
    if missing:
        detail = f"run(s) {', '.join(map(str, missing))} not found"
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=detail)


def get_run(run_id: RunId, session: SessionDep) -> Run:
    return found(session, Run, run_id, "run")


def get_owned_run(run_id: RunId, session: SessionDep, credentials: Credentials) -> Run:
    """``get_current_user``, then ``get_run``, then ``owned``, in one worker-thread call (as
    three dependencies they were three): a trainer logs through this every step. The caller
    first: a request without a token learns nothing, not even whether the run exists."""
    user = get_current_user(session, credentials)
    return owned(found(session, Run, run_id, "run"), user, "run")


def get_study(study_id: StudyId, session: SessionDep) -> Study:
    return found(session, Study, study_id, "study")


# The caller is resolved before the study (dependencies run in the order of the parameters):
# 401 before 404, as ``get_owned_run``.
def get_owned_study(user: CurrentUser, study: Annotated[Study, Depends(get_study)]) -> Study:
    return owned(study, user, "study")


def get_pipeline(pipeline_id: PipelineId, session: SessionDep) -> Pipeline:
    return found(session, Pipeline, pipeline_id, "pipeline")


def get_owned_pipeline(
    user: CurrentUser, pipeline: Annotated[Pipeline, Depends(get_pipeline)]
) -> Pipeline:
    return owned(pipeline, user, "pipeline")


RunDep = Annotated[Run, Depends(get_run)]
OwnedRunDep = Annotated[Run, Depends(get_owned_run)]
StudyDep = Annotated[Study, Depends(get_study)]
OwnedStudyDep = Annotated[Study, Depends(get_owned_study)]
PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
OwnedPipelineDep = Annotated[Pipeline, Depends(get_owned_pipeline)]


def get_cluster(session: SessionDep, settings: SettingsDep) -> Cluster:
    """The live workers, read once per request: queued runs say why they wait."""
    return Cluster.load(session, settings)


ClusterDep = Annotated[Cluster, Depends(get_cluster)]


@dataclass(frozen=True)
class StreamStart:
    """What a live stream reads from the database before it begins."""

    caller: str  # whose streams it counts against: "user NAME" or "client ADDRESS"
    run_id: int = 0
    write_seq: int = 0  # the run's write sequence when the stream opened


def stream_caller(user: str | None, request: Request, settings: Settings) -> str:
    """Whose streams a stream counts against: a valid token's user, else the client's address
    (a made-up token counts as no token, so it cannot dodge the bound). Behind a proxy, list
    it in CONSPO_TRUSTED_PROXIES so that the address is the client's, not the proxy's. A
    request carrying X-Forwarded-For when no proxy is trusted may have had its address taken
    from that header by a server run with uvicorn's defaults (which trust loopback's): all
    such requests count as one caller, so a new made-up address per stream buys nothing."""
    if user is not None:
        return f"user {user}"
    if not settings.trusted_proxies and "x-forwarded-for" in request.headers:
        return "client behind an untrusted X-Forwarded-For"
    return f"client {request.client.host if request.client else 'unknown'}"


def _read_stream_start(
    db: Database, run_id: int | None, token: str | None
) -> tuple[int | None, str | None]:
    """(the run's write sequence, None if it does not exist; the token's user name)."""
    with db.read_session() as session:
        run = session.get(Run, run_id) if run_id is not None else None
        user = user_for_token(session, token) if token else None
        return run.write_seq if run is not None else None, user.name if user is not None else None


async def _stream_start(
    request: Request,
    hub: StreamHub,
    db: Database,
    settings: Settings,
    credentials: HTTPAuthorizationCredentials | None,
    run_id: int | None,
) -> StreamStart:
    """Read on the hub's own connections (``stream_db_connections``), not a request's session
    slot: opening a stream never waits behind the reads that fill those slots."""
    token = credentials.credentials if credentials is not None else None
    write_seq, user = await hub.read(_read_stream_start, db, run_id, token or None)
    if run_id is not None and write_seq is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"run {run_id} not found")
    return StreamStart(stream_caller(user, request, settings), run_id or 0, write_seq or 0)


async def start_run_stream(
    run_id: RunId,
    request: Request,
    hub: StreamHubDep,
    db: DatabaseDep,
    settings: SettingsDep,
    credentials: Credentials,
) -> StreamStart:
    return await _stream_start(request, hub, db, settings, credentials, run_id)


async def start_runs_stream(
    request: Request,
    hub: StreamHubDep,
    db: DatabaseDep,
    settings: SettingsDep,
    credentials: Credentials,
) -> StreamStart:
    return await _stream_start(request, hub, db, settings, credentials, None)


RunStreamStart = Annotated[StreamStart, Depends(start_run_stream)]
RunsStreamStart = Annotated[StreamStart, Depends(start_runs_stream)]
