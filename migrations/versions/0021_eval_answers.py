"""Per-problem evaluation results (``eval_answers``): each evaluation's held-out and benchmark
problems, their answers, correctness, s_θ and pass@k draws; empty for every run logged before
this revision.

Revision ID: 0021
Revises: 0020
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eval_answers",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=100), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("problem_key", sa.String(length=64), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("reference", sa.Text(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("solved", sa.Boolean(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("samples_correct", sa.Integer(), nullable=False),
        sa.Column("episode", sa.JSON(none_as_null=True), nullable=True),
        sa.PrimaryKeyConstraint(
            "run_id", "step", "source", "position", name=op.f("pk_eval_answers")
        ),
    )
    op.create_index(
        "ix_eval_answers_run_source_key", "eval_answers", ["run_id", "source", "problem_key"]
    )


def downgrade() -> None:
    op.drop_table("eval_answers")
