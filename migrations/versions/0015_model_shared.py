"""Shared models: a run's owner may let other users start from its checkpoints (``model_shared``;
``PATCH /api/runs/{id}`` sets it; false by default, so every existing run stays its owner's).

Revision ID: 0015
Revises: 0014
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("model_shared", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("model_shared")
