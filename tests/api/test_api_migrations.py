"""Alembic: upgrade from empty to head and downgrade to base, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from backend.db import make_engine
from backend.migrate import migrate
from backend.models import Base
from tests.api.conftest import create_pg_database, drop_pg_database

TABLES = {"users", "api_tokens", "runs", "metrics", "metric_rollups", "rollouts"}


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_upgrade_downgrade_roundtrip(dialect: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}" if dialect == "sqlite" else create_pg_database()
    try:
        migrate(url, "head")
        assert tables(url) == TABLES == set(Base.metadata.tables)
        engine = make_engine(url)
        pk = inspect(engine).get_pk_constraint("metrics")["constrained_columns"]
        engine.dispose()
        assert pk == ["run_id", "key", "step"]
        migrate(url, "base")
        assert tables(url) == set()
        migrate(url, "head")  # and up again
        assert tables(url) == TABLES
    finally:
        if dialect == "postgresql":
            drop_pg_database(url)
