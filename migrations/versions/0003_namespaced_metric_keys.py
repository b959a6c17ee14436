"""Namespace the top-level metric keys of worker runs: loss → optim/loss, and so on.

The metric catalogue (``conspo/metrics.py``) names every key ``<namespace>/<name>``; five keys
predate that. Points, cached rollups and run summaries of worker runs are renamed. External runs
keep what their clients logged: a client that still sends ``loss`` would otherwise split its
series in two. A point whose new key already exists at the same step (it cannot happen for a
worker run, but a hand-edited database might) keeps its old key rather than being lost.

The rename map is written out here, not imported: a migration must keep meaning what it meant
when it was written, whatever the catalogue becomes.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RENAMES = {
    "loss": "optim/loss",
    "grad_norm": "optim/grad_norm",
    "lr": "optim/lr",
    "entropy": "policy/entropy",
    "kl": "policy/kl",
}


def upgrade() -> None:
    _rename(RENAMES)


def downgrade() -> None:
    _rename({new: old for old, new in RENAMES.items()})


def _rename(mapping: dict[str, str]) -> None:
    conn = op.get_bind()
    worker_runs = "SELECT id FROM runs WHERE external = :external"
    for old, new in mapping.items():
        params = {"old": old, "new": new, "external": False}
        conn.execute(
            sa.text(
                "UPDATE metrics SET key = :new WHERE key = :old"
                f" AND run_id IN ({worker_runs}) AND NOT EXISTS (SELECT 1 FROM metrics m2"
                " WHERE m2.run_id = metrics.run_id AND m2.key = :new AND m2.step = metrics.step)"
            ),
            params,
        )
        # The rollup cache is refilled by the next reader.
        conn.execute(
            sa.text(
                f"DELETE FROM metric_rollups WHERE key IN (:old, :new) AND run_id IN ({worker_runs})"
            ),
            params,
        )
    runs = sa.table(
        "runs", sa.column("id", sa.Integer), sa.column("summary", sa.JSON), sa.column("external")
    )
    rows = conn.execute(sa.select(runs.c.id, runs.c.summary).where(runs.c.external.is_(False)))
    for run_id, summary in rows.all():
        if not summary or not set(summary) & set(mapping):
            continue
        renamed = {}
        for key, value in summary.items():
            new = mapping.get(key)
            renamed[new if new is not None and new not in summary else key] = value
        conn.execute(runs.update().where(runs.c.id == run_id).values(summary=renamed))
