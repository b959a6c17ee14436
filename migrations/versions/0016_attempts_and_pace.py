"""Where the latest attempt resumed (``resumed_from_step``: the checkpoint's step; null for a run
that never resumed), shown on the run page and by ``conspo-lab runs`` beside its attempts; and
the run's pace (``pace_s``: seconds per step lately, evaluations and checkpoints included;
``last_step_at``: when its latest step was logged, unix time), from which the API computes the
one ETA every page counts down (``backend.runs.progress``).

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("resumed_from_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pace_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("last_step_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("last_step_at")
        batch.drop_column("pace_s")
        batch.drop_column("resumed_from_step")
