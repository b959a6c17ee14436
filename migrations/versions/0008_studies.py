"""Studies: ``studies`` (arms × seeds, an objective, a concurrency limit) and ``study_runs``.

A ``study_runs`` row is one (arm, seed) of a study: ``pending`` until a slot under the study's
concurrency frees, then ``released`` with the id of the ordinary run it became.

Revision ID: 0008
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("baseline", sa.String(length=100), nullable=True),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_studies_owner_id_users"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_studies")),
    )
    op.create_index(op.f("ix_studies_owner_id"), "studies", ["owner_id"])
    op.create_index(op.f("ix_studies_status"), "studies", ["status"])
    op.create_table(
        "study_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("arm", sa.String(length=100), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("trial", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["studies.id"],
            name=op.f("fk_study_runs_study_id_studies"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_study_runs_run_id_runs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_study_runs")),
    )
    op.create_index("ix_study_runs_study_state", "study_runs", ["study_id", "state"])
    op.create_index(
        "uq_study_runs_arm_seed", "study_runs", ["study_id", "arm", "seed"], unique=True
    )
    op.create_index(op.f("ix_study_runs_run_id"), "study_runs", ["run_id"])


def downgrade() -> None:
    op.drop_table("study_runs")
    op.drop_table("studies")
