"""Alerts: ``alert_rules`` (an event of the runs in a scope, delivered to a webhook) and
``alert_firings`` (a rule that fired for a run, once per pair, with its delivery's state).

Revision ID: 0020
Revises: 0019
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alert_rules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False, server_default=""),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("metric_key", sa.String(200), nullable=True),
        sa.Column("comparison", sa.String(16), nullable=True),
        sa.Column("threshold", sa.Float(), nullable=True),
        sa.Column("stall_s", sa.Float(), nullable=True),
        sa.Column("webhook_url", sa.Text(), nullable=False),
        sa.Column("webhook_format", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_id"],
            ["users.id"],
            name=op.f("fk_alert_rules_owner_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_rules")),
    )
    op.create_index("ix_alert_rules_owner_id", "alert_rules", ["owner_id"])
    op.create_index("ix_alert_rules_run_id", "alert_rules", ["run_id"])
    op.create_index("ix_alert_rules_study_id", "alert_rules", ["study_id"])
    op.create_table(
        "alert_firings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rule_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["rule_id"],
            ["alert_rules.id"],
            name=op.f("fk_alert_firings_rule_id_alert_rules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_firings")),
    )
    op.create_index(
        "ux_alert_firings_rule_run", "alert_firings", ["rule_id", "run_id"], unique=True
    )
    op.create_index("ix_alert_firings_state_next", "alert_firings", ["state", "next_attempt_at"])
    op.create_index("ix_alert_firings_run_id", "alert_firings", ["run_id"])


def downgrade() -> None:
    op.drop_table("alert_firings")
    op.drop_table("alert_rules")
