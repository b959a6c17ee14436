"""Per-prompt pass rates: ``prompt_stats`` (run_id, step, prompt_key) -> (n, correct).

One row per prompt a step sampled (the DB sink writes them with the step's metrics; external
runs may log them), read by ``GET /api/runs/{id}/prompts``.

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "prompt_stats",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("prompt_key", sa.String(length=64), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("correct", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step", "prompt_key", name=op.f("pk_prompt_stats")),
    )


def downgrade() -> None:
    op.drop_table("prompt_stats")
