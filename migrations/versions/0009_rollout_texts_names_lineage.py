"""Rollout texts, unique run names and clone lineage.

* ``rollout_texts`` (run_id, step, group, index) -> (prompt, completion): the text of each
  sampled rollout, at most ``conspo.sink.ROLLOUT_TEXT_CHARS`` characters each, for the run page's
  rollout table.
* ``runs.cloned_from``: the run a clone was made from (NULL for others).
* ``ux_runs_name``: run names are unique. Runs that shared a name keep the oldest one as it is;
  the later ones get ``-<id>`` appended.

Revision ID: 0009
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rollout_texts",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("group", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "step", "group", "index", name=op.f("pk_rollout_texts")),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("cloned_from", sa.Integer(), nullable=True))
    _rename_duplicates()
    op.create_index("ux_runs_name", "runs", ["name"], unique=True)


def _rename_duplicates() -> None:
    bind = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.Integer), sa.column("name", sa.String))
    seen: set[str] = set()
    renames: list[dict[str, object]] = []
    for run_id, name in bind.execute(sa.select(runs.c.id, runs.c.name).order_by(runs.c.id)):
        if name in seen:
            name = f"{name[:190]}-{run_id}"
            renames.append({"rid": run_id, "new": name})
        seen.add(name)
    if renames:
        bind.execute(
            runs.update().where(runs.c.id == sa.bindparam("rid")).values(name=sa.bindparam("new")),
            renames,
        )


def downgrade() -> None:
    op.drop_index("ux_runs_name", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("cloned_from")
    op.drop_table("rollout_texts")
