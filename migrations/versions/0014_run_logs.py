"""The run's log: what its training process printed, in chunks of whole lines (``run_logs``).

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_logs",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("wall_time", sa.Float(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("nbytes", sa.Integer(), nullable=False),
        sa.Column("cut", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "seq", name=op.f("pk_run_logs")),
    )


def downgrade() -> None:
    op.drop_table("run_logs")
