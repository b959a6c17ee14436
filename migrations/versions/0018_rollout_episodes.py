"""A sampled rollout's environment episode (``rollout_texts.episode``: the first observation,
each turn's action, observation, reward, done and error, and the outcome, as
``conspo.sink.episode_json`` keeps them), shown turn by turn in the run page's rollout viewer;
null for a rollout that played no environment (every rollout stored before this revision).

Revision ID: 0018
Revises: 0017
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rollout_texts") as batch:
        batch.add_column(sa.Column("episode", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout_texts") as batch:
        batch.drop_column("episode")
