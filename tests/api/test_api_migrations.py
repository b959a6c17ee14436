"""Alembic: upgrade from empty to head and downgrade to base, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text

from backend.db import make_engine
from backend.migrate import alembic_config, migrate
from backend.models import Base
from conspo import metrics as M
from tests.api.conftest import create_pg_database, drop_pg_database

TABLES = {
    "users", "api_tokens", "runs", "metrics", "metric_rollups", "rollout_steps", "workers",
    "prompt_stats", "rollout_texts", "studies", "study_runs", "pipelines", "run_logs",
    "alert_rules", "alert_firings", "eval_answers",
}  # fmt: skip


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
        prompt_pk = inspect(engine).get_pk_constraint("prompt_stats")["constrained_columns"]
        engine.dispose()
        assert pk == ["run_id", "key", "step"]
        assert prompt_pk == ["run_id", "step", "prompt_key"]
        migrate(url, "base")
        assert tables(url) == set()
        migrate(url, "head")  # and up again
        assert tables(url) == TABLES
    finally:
        if dialect == "postgresql":
            drop_pg_database(url)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0003_namespaces_legacy_keys_of_worker_runs_only(dialect: str, tmp_path: Path) -> None:
    """Worker runs' loss/grad_norm/lr/entropy/kl move to optim/* and policy/*; external runs
    keep what their clients logged; downgrading restores the old names."""
    url = f"sqlite:///{tmp_path / 'm.db'}" if dialect == "sqlite" else create_pg_database()
    engine = make_engine(url)
    try:
        migrate(url, "0002")
        with engine.begin() as conn:
            for run_id, external in ((1, False), (2, True)):
                conn.execute(
                    text(
                        "INSERT INTO runs (id, name, status, cancel_requested, algorithm, task,"
                        " model, config, seed, tags, step, total_steps, created_at, updated_at,"
                        " summary, external, attempt, write_seq) VALUES (:id, 'r', 'succeeded',"
                        " :f, 'grpo', 'arith', 'tiny', '{}', 0, '[]', 2, 2, :now, :now,"
                        " :summary, :external, 1, 1)"
                    ),
                    {
                        "id": run_id,
                        "f": False,
                        "now": datetime.now(UTC),
                        "summary": json.dumps({"loss": 0.5, "sep/gap": 0.1, "lr": 1e-5}),
                        "external": external,
                    },
                )
                for key in ("loss", "lr", "entropy", "sep/gap"):
                    conn.execute(
                        text(
                            "INSERT INTO metrics (run_id, key, step, value, wall_time, seq)"
                            " VALUES (:r, :k, 1, 1.0, 0.0, 1)"
                        ),
                        {"r": run_id, "k": key},
                    )
        migrate(url, "head")

        def keys(run_id: int) -> set[str]:
            with engine.connect() as conn:
                rows = conn.execute(
                    text("SELECT key FROM metrics WHERE run_id = :r"), {"r": run_id}
                )
                return {r[0] for r in rows}

        def summary(run_id: int) -> dict[str, float]:
            with engine.connect() as conn:
                raw = conn.execute(text("SELECT summary FROM runs WHERE id = :r"), {"r": run_id})
                value = raw.scalar_one()
            return json.loads(value) if isinstance(value, str) else value

        assert keys(1) == {M.LOSS, M.LR, M.ENTROPY, M.SEP_GAP}
        assert summary(1) == {M.LOSS: 0.5, M.SEP_GAP: 0.1, M.LR: 1e-5}
        assert keys(2) == {"loss", "lr", "entropy", "sep/gap"}  # external: untouched
        assert summary(2) == {"loss": 0.5, "sep/gap": 0.1, "lr": 1e-5}
        command.downgrade(alembic_config(url), "0002")
        assert keys(1) == {"loss", "lr", "entropy", "sep/gap"}
        assert summary(1) == {"loss": 0.5, "sep/gap": 0.1, "lr": 1e-5}
    finally:
        engine.dispose()
        if dialect == "postgresql":
            drop_pg_database(url)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0004_existing_runs_start_with_no_worker_deaths(dialect: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}" if dialect == "sqlite" else create_pg_database()
    engine = make_engine(url)
    try:
        migrate(url, "0003")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO runs (id, name, status, cancel_requested, algorithm, task, model,"
                    " config, seed, tags, step, total_steps, created_at, updated_at, summary,"
                    " external, attempt, write_seq) VALUES (1, 'r', 'queued', :f, 'grpo',"
                    " 'arith', 'tiny', '{}', 0, '[]', 0, 2, :now, :now, '{}', :f, 0, 0)"
                ),
                {"f": False, "now": datetime.now(UTC)},
            )
        migrate(url, "head")
        with engine.connect() as conn:
            row = conn.execute(text("SELECT worker_deaths, last_worker_death FROM runs")).one()
        assert tuple(row) == (0, None)
        command.downgrade(alembic_config(url), "0003")
        assert "workers" not in tables(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 1
    finally:
        engine.dispose()
        if dialect == "postgresql":
            drop_pg_database(url)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0011_moves_job_kinds_out_of_algorithm(dialect: str, tmp_path: Path) -> None:
    """A non-RL worker run stored its kind in ``algorithm``: it moves to ``kind`` and the
    algorithm becomes NULL; RL and external runs keep theirs. Downgrading puts it back."""
    url = f"sqlite:///{tmp_path / 'm.db'}" if dialect == "sqlite" else create_pg_database()
    engine = make_engine(url)
    runs = [  # id, algorithm column, stored config, external
        (1, "sft", {"kind": "sft", "algorithm": "conspo"}, False),
        (2, "grpo", {"kind": "rl", "algorithm": "grpo"}, False),
        (3, "conspo", {"algorithm": "conspo"}, False),  # stored before kinds existed
        (4, "trl-grpo", {"kind": "sft"}, True),  # a client's free-form config
    ]
    try:
        migrate(url, "0010")
        with engine.begin() as conn:
            for run_id, algorithm, config, external in runs:
                conn.execute(
                    text(
                        "INSERT INTO runs (id, name, status, cancel_requested, algorithm, task,"
                        " model, config, seed, tags, step, total_steps, created_at, updated_at,"
                        " summary, external, attempt, write_seq, worker_deaths) VALUES (:id, :n,"
                        " 'succeeded', :f, :a, 'arith', 'tiny', :c, 0, '[]', 1, 1, :now, :now,"
                        " '{}', :x, 1, 0, 0)"
                    ),
                    {
                        "id": run_id, "n": f"r{run_id}", "f": False, "a": algorithm,
                        "c": json.dumps(config), "x": external, "now": datetime.now(UTC),
                    },
                )  # fmt: skip

        def stored() -> list[tuple[int, str | None, str | None]]:
            with engine.connect() as conn:
                if "kind" not in {c["name"] for c in inspect(conn).get_columns("runs")}:
                    rows = conn.execute(text("SELECT id, NULL, algorithm FROM runs ORDER BY id"))
                else:
                    rows = conn.execute(text("SELECT id, kind, algorithm FROM runs ORDER BY id"))
                return [tuple(r) for r in rows]  # type: ignore[misc]

        migrate(url, "head")
        assert stored() == [(1, "sft", None), (2, "rl", "grpo"), (3, "rl", "conspo"),
                            (4, "rl", "trl-grpo")]  # fmt: skip
        command.downgrade(alembic_config(url), "0010")
        assert [a for _, _, a in stored()] == ["sft", "grpo", "conspo", "trl-grpo"]
    finally:
        engine.dispose()
        if dialect == "postgresql":
            drop_pg_database(url)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0012_packs_each_steps_rollouts_into_one_row_and_back(dialect: str, tmp_path: Path) -> None:
    """Every stored rollout survives the move into per-step rows of arrays (NULL rewards and
    scores included, (group, index) order whatever the insertion order) and the way back."""
    from sqlalchemy.orm import Session

    from backend.storage.rollouts import query_rollouts

    url = f"sqlite:///{tmp_path / 'm.db'}" if dialect == "sqlite" else create_pg_database()
    engine = make_engine(url)
    rollouts = [  # run, step, group, index, reward, score, length, truncated
        (run, step, g, i, None if (g, i) == (1, 0) else 0.5 * i, None if i == 2 else -0.1 * i,
         3 + i, i == 1)
        for run in (1, 2)
        for step in (1, 2, 5)
        for g in (1, 0)  # stored out of order
        for i in range(3)
    ]  # fmt: skip
    columns = '(run_id, step, "group", "index", reward, score, length, truncated)'
    try:
        migrate(url, "0011")
        with engine.begin() as conn:
            conn.execute(
                text(f"INSERT INTO rollouts {columns} VALUES (:r, :s, :g, :i, :rw, :sc, :l, :t)"),
                [dict(zip(("r", "s", "g", "i", "rw", "sc", "l", "t"), r, strict=True))
                 for r in rollouts],
            )  # fmt: skip
        migrate(url, "head")
        with Session(engine) as session:
            got = [
                (run, *item.values())
                for run in (1, 2)
                for item in query_rollouts(session, run, None, None, 1000)
            ]
            steps = session.execute(text("SELECT count(*) FROM rollout_steps")).scalar()
        assert got == sorted(rollouts) and steps == 6
        command.downgrade(alembic_config(url), "0011")
        with engine.connect() as conn:
            back = conn.execute(
                text(f"SELECT {columns[1:-1]} FROM rollouts ORDER BY 1, 2, 3, 4")
            ).all()
        assert [tuple(r) for r in back] == sorted(rollouts)
    finally:
        engine.dispose()
        if dialect == "postgresql":
            drop_pg_database(url)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0015_existing_runs_stay_their_owners(dialect: str, tmp_path: Path) -> None:
    """A run stored before models could be shared is not shared; downgrading drops the flag."""
    url = f"sqlite:///{tmp_path / 'm.db'}" if dialect == "sqlite" else create_pg_database()
    engine = make_engine(url)
    try:
        migrate(url, "0014")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO runs (id, name, status, cancel_requested, kind, algorithm, task,"
                    " model, config, seed, tags, step, total_steps, created_at, updated_at,"
                    " summary, external, attempt) VALUES (1, 'r', 'succeeded', :f, 'rl', 'grpo',"
                    " 'arith', 'tiny', '{}', 0, '[]', 2, 2, :now, :now, '{}', :f, 1)"
                ),
                {"f": False, "now": datetime.now(UTC)},
            )
        migrate(url, "head")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT model_shared FROM runs")).scalar_one() in (False, 0)
        command.downgrade(alembic_config(url), "0014")
        with engine.connect() as conn:
            assert "model_shared" not in {c["name"] for c in inspect(conn).get_columns("runs")}
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar_one() == 1
    finally:
        engine.dispose()
        if dialect == "postgresql":
            drop_pg_database(url)
