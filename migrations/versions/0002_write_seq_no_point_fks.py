"""Write sequence for the live stream; no per-row foreign-key checks on metrics and rollouts.

* ``runs.write_seq``: bumped by every metric write (under the run row's lock), and
  ``metrics.seq``: the ``write_seq`` of the write that last touched the point, indexed by
  (run_id, seq). The live stream's cursor is this sequence, so a key written later to an
  already-streamed step is still sent.
* The foreign keys of metrics, rollouts and metric_rollups to runs go: PostgreSQL checked them
  with one trigger query per inserted row, about half the cost of a bulk write. Every writer
  locks the run row before writing (``backend.storage.write_points``; the rollup cache locks it
  FOR SHARE) and ``backend.crud.delete_run`` deletes the run row before its points, so no
  orphan can appear.

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("write_seq", sa.BigInteger(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.add_column(sa.Column("seq", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.drop_constraint("fk_metrics_run_id_runs", type_="foreignkey")
        batch_op.create_index("ix_metrics_run_seq", ["run_id", "seq"], unique=False)
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.drop_constraint("fk_rollouts_run_id_runs", type_="foreignkey")
    with op.batch_alter_table("metric_rollups", schema=None) as batch_op:
        batch_op.drop_constraint("fk_metric_rollups_run_id_runs", type_="foreignkey")


def downgrade() -> None:
    # Points whose run is gone would violate the restored keys.
    op.execute("DELETE FROM metrics WHERE run_id NOT IN (SELECT id FROM runs)")
    op.execute("DELETE FROM rollouts WHERE run_id NOT IN (SELECT id FROM runs)")
    op.execute("DELETE FROM metric_rollups WHERE run_id NOT IN (SELECT id FROM runs)")
    with op.batch_alter_table("metric_rollups", schema=None) as batch_op:
        batch_op.create_foreign_key(
            "fk_metric_rollups_run_id_runs", "runs", ["run_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("rollouts", schema=None) as batch_op:
        batch_op.create_foreign_key(
            "fk_rollouts_run_id_runs", "runs", ["run_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_metrics_run_seq")
        batch_op.create_foreign_key(
            "fk_metrics_run_id_runs", "runs", ["run_id"], ["id"], ondelete="CASCADE"
        )
        batch_op.drop_column("seq")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("write_seq")
