"""Runs say what they train in a column of their own: ``runs.kind`` (rl, sft, distill, dpo), and
``runs.algorithm`` holds only an algorithm (NULL for a kind that trains none).

Until now a non-RL run stored its kind in ``algorithm``. Backfill: ``kind`` from each worker
run's config (``rl`` when it names none, as ``RunConfig.kind`` defaults); a non-RL run's
``algorithm`` becomes NULL. External runs are ``rl`` (their client's algorithm stays).
Downgrade writes the kind back into ``algorithm`` for the runs that are not ``rl``.

Revision ID: 0011
Revises: 0010
"""

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFAULT_KIND = "rl"  # RunConfig.kind's default when this revision was written

RUNS = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("algorithm", sa.String),
    sa.column("config", sa.JSON),
    sa.column("external", sa.Boolean),
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("kind", sa.String(32), nullable=False, server_default=DEFAULT_KIND)
        )
        batch.alter_column("algorithm", existing_type=sa.String(100), nullable=True)
    bind = op.get_bind()
    rows = bind.execute(sa.select(RUNS.c.id, RUNS.c.config).where(RUNS.c.external.is_(False)))
    moved = [
        {"rid": run_id, "k": kind}
        for run_id, config in rows
        if (kind := _kind_of(config)) != DEFAULT_KIND
    ]
    if moved:
        bind.execute(
            RUNS.update()
            .where(RUNS.c.id == sa.bindparam("rid"))
            .values(kind=sa.bindparam("k"), algorithm=None),
            moved,
        )


def _kind_of(config: Any) -> str:
    if isinstance(config, str):  # a JSON column read back as text by an older driver
        config = json.loads(config)
    kind = config.get("kind") if isinstance(config, dict) else None
    return kind if isinstance(kind, str) and kind else DEFAULT_KIND


def downgrade() -> None:
    bind = op.get_bind()
    bind.execute(
        RUNS.update().where(RUNS.c.kind != DEFAULT_KIND).values(algorithm=RUNS.c.kind)
    )
    bind.execute(RUNS.update().where(RUNS.c.algorithm.is_(None)).values(algorithm=DEFAULT_KIND))
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("algorithm", existing_type=sa.String(100), nullable=False)
        batch.drop_column("kind")
