"""Pipelines: stage configs submitted as one unit, each stage's run created when the previous
one succeeds.

* ``pipelines``: id, name, owner, ``stages`` (the ordered stage configs, JSON) and ``released``
  (how many stages have their run; ``lifecycle.finish`` moves it on, conditionally).
* ``runs.pipeline_id`` / ``runs.pipeline_stage``: the pipeline and stage (0-based) a run is.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pipelines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.Column("stages", sa.JSON(), nullable=False),
        sa.Column("released", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["users.id"],
            name=op.f("fk_pipelines_owner_id_users"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pipelines")),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("pipeline_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pipeline_stage", sa.Integer(), nullable=True))
        batch.create_index("ix_runs_pipeline_id", ["pipeline_id"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_index("ix_runs_pipeline_id")
        batch.drop_column("pipeline_stage")
        batch.drop_column("pipeline_id")
    op.drop_table("pipelines")
