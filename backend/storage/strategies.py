"""Which storage strategy a session's engine uses: one ``Dialect`` per engine, made on its
first use (``dialect_of``). Apart from ``dialect``, so the base class never imports its own
subclasses."""

from __future__ import annotations

from weakref import WeakKeyDictionary

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from backend.storage.dialect import Dialect
from backend.storage.postgresql import PostgresDialect
from backend.storage.sqlite import SqliteDialect

_BY_ENGINE: WeakKeyDictionary[Engine, Dialect] = WeakKeyDictionary()


def dialect_of(session: Session) -> Dialect:
    """The storage strategy of the session's engine (made on the engine's first use)."""
    engine = session.get_bind().engine
    strategy = _BY_ENGINE.get(engine)
    if strategy is None:
        strategy = _BY_ENGINE.setdefault(engine, _make(engine.dialect.name))
    return strategy


def _make(name: str) -> Dialect:
    known: dict[str, type[Dialect]] = {c.name: c for c in (PostgresDialect, SqliteDialect)}
    if name not in known:
        raise ValueError(f"no storage dialect for {name!r}; known: {', '.join(sorted(known))}")
    return known[name]()
