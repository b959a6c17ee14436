"""A step's rollouts in one row: ``rollout_steps`` (run_id, step) -> an array per field, replacing
``rollouts`` (one row per rollout).

A write then adds one row per step instead of one per sampled rollout (64 a step in the bench):
the per-row costs of a bulk write (the row header, the primary key's index entry, the WAL
record) are paid once per step. Element i of every array is one rollout, in (group, index)
order. PostgreSQL stores arrays (``integer[]``, ``double precision[]``, ``boolean[]``; a NULL
reward or score is a NULL element), SQLite JSON lists. On PostgreSQL the table keeps rows of up
to ~8 kB in line and uncompressed (``toast_tuple_target``): a step of 64 rollouts is a 2 kB row
either way, but at 128 a step the default compressed each row (2,000 steps: 0.08 s of server
CPU against 0.05-0.06 s, 5.3 MB against 8.3 MB on disk); writes are what has to be fast.

Upgrade and downgrade move every stored rollout across (PostgreSQL in one statement, SQLite
through Python, a run at a time).

Revision ID: 0012
Revises: 0011
"""

import json
from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FIELDS = ("group", "index", "reward", "score", "length", "truncated")
KINDS = {
    "group": sa.Integer,
    "index": sa.Integer,
    "reward": sa.Float,
    "score": sa.Float,
    "length": sa.Integer,
    "truncated": sa.Boolean,
}
ROLLOUTS = sa.table(
    "rollouts",
    sa.column("run_id", sa.Integer),
    sa.column("step", sa.Integer),
    *(sa.column(name, kind) for name, kind in KINDS.items()),
)
ROLLOUT_STEPS = sa.table(
    "rollout_steps",
    sa.column("run_id", sa.Integer),
    sa.column("step", sa.Integer),
    *(sa.column(name, sa.JSON) for name in FIELDS),
)
ROWS_PER_INSERT = 1000


def _array(kind: Any) -> Any:
    return sa.JSON().with_variant(postgresql.ARRAY(kind), "postgresql")


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def upgrade() -> None:
    op.create_table(
        "rollout_steps",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        *(sa.Column(name, _array(kind()), nullable=False) for name, kind in KINDS.items()),
        sa.PrimaryKeyConstraint("run_id", "step", name=op.f("pk_rollout_steps")),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("ALTER TABLE rollout_steps SET (toast_tuple_target = 8160)")
        order = '"group", "index"'
        arrays = ", ".join(f'array_agg("{n}" ORDER BY {order})' for n in FIELDS)
        op.execute(
            f"INSERT INTO rollout_steps (run_id, step, {_quoted(FIELDS)})"
            f" SELECT run_id, step, {arrays} FROM rollouts GROUP BY run_id, step"
        )
    else:
        for run_id in _run_ids(bind, ROLLOUTS):
            rows = bind.execute(
                sa.select(ROLLOUTS)
                .where(ROLLOUTS.c.run_id == run_id)
                .order_by(ROLLOUTS.c.step, ROLLOUTS.c.group, ROLLOUTS.c.index)
            ).all()
            steps = (
                {"run_id": run_id, "step": step}
                | {n: [getattr(r, n) for r in rollouts] for n in FIELDS}
                for step, rollouts in _by_step(rows)
            )
            _insert(bind, ROLLOUT_STEPS, steps)
    op.drop_table("rollouts")


def downgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("group", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step", "group", "index", name=op.f("pk_rollouts")),
    )
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        arrays = ", ".join(f'r."{n}"' for n in FIELDS)
        op.execute(
            f"INSERT INTO rollouts (run_id, step, {_quoted(FIELDS)})"
            f" SELECT r.run_id, r.step, u.* FROM rollout_steps r, unnest({arrays}) AS u"
        )
    else:
        for run_id in _run_ids(bind, ROLLOUT_STEPS):
            rows = bind.execute(
                sa.select(ROLLOUT_STEPS)
                .where(ROLLOUT_STEPS.c.run_id == run_id)
                .order_by(ROLLOUT_STEPS.c.step)
            ).all()
            _insert(bind, ROLLOUTS, _unpacked(rows))
    op.drop_table("rollout_steps")


def _run_ids(bind: Any, table: Any) -> list[int]:
    return list(bind.scalars(sa.select(table.c.run_id).distinct()))


def _by_step(rows: Any) -> Iterator[tuple[int, list[Any]]]:
    for step, rollouts in groupby(rows, key=lambda r: r.step):
        yield step, list(rollouts)


def _unpacked(rows: Any) -> Iterator[dict[str, Any]]:
    for row in rows:
        arrays = [_list(getattr(row, n)) for n in FIELDS]
        for values in zip(*arrays, strict=True):
            yield {"run_id": row.run_id, "step": row.step} | dict(zip(FIELDS, values, strict=True))


def _list(value: Any) -> list[Any]:
    return json.loads(value) if isinstance(value, str) else list(value)


def _insert(bind: Any, table: Any, rows: Iterator[dict[str, Any]]) -> None:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == ROWS_PER_INSERT:
            bind.execute(table.insert(), chunk)
            chunk = []
    if chunk:
        bind.execute(table.insert(), chunk)
