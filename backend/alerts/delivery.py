"""Sending the firings due: claim one (a conditional update, so one process sends it), call its
webhook outside any transaction, record what happened."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from backend.alerts import webhooks
from backend.config import Settings
from backend.models import AlertFiring, AlertRule, Run, utcnow

FIRST_WAIT_S = 2.0  # then 4, 8, ... between calls
MAX_WAIT_S = 600.0
BATCH = 50  # firings looked at per pass


def _due(now: datetime) -> object:
    return or_(
        and_(AlertFiring.state == "pending", AlertFiring.next_attempt_at <= now),
        and_(AlertFiring.state == "sending", AlertFiring.claimed_until < now),
    )


def claim(session: Session, firing_id: int, lease_s: float) -> bool:
    """Take firing ``firing_id`` to send, if it is due and nobody else holds it."""
    now = utcnow()
    taken = session.execute(
        update(AlertFiring)
        .where(AlertFiring.id == firing_id, _due(now))  # type: ignore[arg-type]
        .values(
            state="sending",
            claimed_until=now + timedelta(seconds=lease_s),
            attempts=AlertFiring.attempts + 1,
        )
    )
    session.commit()
    return bool(taken.rowcount)  # type: ignore[attr-defined]


class Sender:
    """This process's deliveries, within its webhook call budget (``webhooks.CALLS``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def deliver_due(self, session: Session) -> int:
        """Send what is due; how many calls were made."""
        ids = session.scalars(
            select(AlertFiring.id)
            .where(_due(utcnow()))  # type: ignore[arg-type]
            .order_by(AlertFiring.next_attempt_at, AlertFiring.id)
            .limit(BATCH)
        ).all()
        session.commit()
        made = 0
        lease = self.settings.alert_timeout_s * 3 + 30
        for firing_id in ids:
            if not webhooks.CALLS.take(self.settings.alert_per_minute):
                break  # the rest wait for the next pass
            if not claim(session, firing_id, lease):
                continue
            made += 1
            self._send(session, firing_id)
        return made

    def _send(self, session: Session, firing_id: int) -> None:
        firing = session.get(AlertFiring, firing_id)
        rule = session.get(AlertRule, firing.rule_id) if firing is not None else None
        if firing is None or rule is None:  # deleted meanwhile
            session.rollback()
            return
        run_name = session.scalar(select(Run.name).where(Run.id == firing.run_id)) or "?"
        alert = webhooks.Alert(
            id=firing.id,
            rule_id=rule.id,
            rule_name=rule.name,
            run_id=firing.run_id,
            run_name=run_name,
            event=firing.event,
            message=firing.message,
            step=firing.step,
            value=firing.value,
            metric=rule.metric_key,
            link=run_link(self.settings, firing.run_id),
        )
        url, fmt, attempts = rule.webhook_url, rule.webhook_format, firing.attempts
        session.commit()  # no transaction is held during the call
        outcome = webhooks.send(url, webhooks.payload(alert, fmt), self.settings)  # type: ignore[arg-type]
        record(session, firing_id, attempts, outcome, self.settings.alert_max_attempts)


def record(
    session: Session, firing_id: int, attempts: int, outcome: webhooks.Outcome, max_attempts: int
) -> None:
    """What a call did: delivered, due again after a doubling wait, or failed for good."""
    now = utcnow()
    values: dict[str, object] = {"claimed_until": None, "last_error": outcome.error}
    if outcome.delivered:
        values |= {"state": "delivered", "delivered_at": now}
    elif outcome.retry and attempts < max_attempts:
        wait = min(FIRST_WAIT_S * 2 ** (attempts - 1), MAX_WAIT_S)
        values |= {"state": "pending", "next_attempt_at": now + timedelta(seconds=wait)}
    else:
        values |= {"state": "failed"}
    session.execute(
        update(AlertFiring)
        .where(AlertFiring.id == firing_id, AlertFiring.state == "sending")
        .values(**values)
    )
    session.commit()


def run_link(settings: Settings, run_id: int) -> str | None:
    base = settings.public_url.rstrip("/")
    return f"{base}/runs/{run_id}" if base else None
