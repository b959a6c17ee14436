"""What each worker can run, and the dtype a run trained in.

* ``workers.gpus``: the worker's GPUs, [{index, name, memory_bytes}] ([] on a CPU node);
  ``workers.capabilities``: {engines, flash_attn, torch, cuda}. The API accepts a config that
  needs an optional package (``sampling.engine: vllm``, ``model.attn_implementation:
  flash_attention_2``) when a live worker advertises it.
* ``runs.dtype``: the compute dtype of the run's last attempt, next to ``runs.device``.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpus", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(
            sa.Column("capabilities", sa.JSON(), nullable=False, server_default="{}")
        )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dtype", sa.String(length=20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("dtype")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("capabilities")
        batch_op.drop_column("gpus")
