"""A sampled rollout's critique (``rollout_texts.critique``: the text a reward gave with the
rollout's value, a judge reward's first judgement, clipped to ``ROLLOUT_TEXT_CHARS``), returned
with the rollout's text by the rollouts endpoint; null where no reward gave one (every rollout
stored before this revision).

Revision ID: 0019
Revises: 0018
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rollout_texts") as batch:
        batch.add_column(sa.Column("critique", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout_texts") as batch:
        batch.drop_column("critique")
