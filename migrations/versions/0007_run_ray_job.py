"""The Ray job a multi-node run trains in.

* ``runs.ray_job_id``: for a run with ``resources.nodes > 1``, the Ray job (and the Ray Train
  run inside it) of its latest attempt, e.g. ``02000000/conspo-run-7-a1``, so an operator can
  find it on the Ray dashboard. NULL for runs that never went to Ray.

Scheduling needs no column: a run's capacity class comes from its stored config
(``backend.runs.scheduling``) and a worker's capacity from its ``workers`` row.

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ray_job_id", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("ray_job_id")
