"""Worker deaths per run (for ``max_attempts``) and a table of live workers (for health).

* ``runs.worker_deaths``: attempts that ended with their worker gone (stale heartbeat);
  ``runs.last_worker_death``: what the reaper found the last time. A run fails once its worker
  died ``CONSPO_MAX_ATTEMPTS`` times instead of taking every worker down in turn.
* ``workers``: one row per worker process, renewed by its reaper thread every pass;
  ``/api/health`` counts the rows seen recently.

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("worker_deaths", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("last_worker_death", sa.Text(), nullable=True))
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workers")),
    )


def downgrade() -> None:
    op.drop_table("workers")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("last_worker_death")
        batch_op.drop_column("worker_deaths")
