"""Alerts: rules that tell a webhook when a run in their scope fails, finishes, stalls or a
metric crosses a line (``backend.alerts``), and what they fired.

A rule belongs to the user who made it; its webhook URL is a secret no answer repeats beyond
its scheme and host. Each caller sees and deletes their own rules (an admin: everyone's)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Response, status
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from backend.alerts import rules as alert_rules
from backend.alerts import webhooks
from backend.alerts.delivery import run_link
from backend.api.body import JSONBodyRoute
from backend.api.contract import refusals
from backend.api.deps import CurrentUser, SessionDep, SettingsDep, found
from backend.config import Settings
from backend.errors import InvalidInput
from backend.models import AlertFiring, AlertRule, Run, Study, User
from backend.schemas import (
    INT32_MAX,
    AlertFiringList,
    AlertRuleCreate,
    AlertRuleList,
    AlertRuleOut,
    AlertTestOut,
)

router = APIRouter(prefix="/alerts", tags=["alerts"], route_class=JSONBodyRoute)

MAX_RULES_PER_USER = 200
DEFAULT_STALL_MINUTES = 10.0
IdQuery = Annotated[int | None, Query(ge=1, le=INT32_MAX)]
RuleId = Annotated[int, Path(ge=1, le=INT32_MAX, description="Alert rule id.")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=AlertRuleOut,
    responses=refusals(
        {
            404: "The run or study of its scope does not exist.",
            409: f"The caller holds {MAX_RULES_PER_USER} rules already.",
        }
    ),
)
def create(
    body: AlertRuleCreate, user: CurrentUser, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    """A rule, checked field by field (422 at the field): a metric rule names its metric and
    comparison (and a threshold unless ``nonfinite``), other events take none of them; the
    webhook is an http(s) URL this platform may call (``CONSPO_ALERT_WEBHOOK_HOSTS``,
    ``CONSPO_ALERT_ALLOW_PRIVATE``)."""
    _check_fields(body, settings)
    if body.run_id is not None:
        found(session, Run, body.run_id, "run")
    elif body.study_id is not None:
        found(session, Study, body.study_id, "study")
    held = session.scalar(select(func.count()).where(AlertRule.owner_id == user.id)) or 0
    if held >= MAX_RULES_PER_USER:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"you hold {held} alert rules, the most one user may: delete some first",
        )
    rule = AlertRule(
        owner_id=user.id,
        name=body.name,
        run_id=body.run_id,
        study_id=body.study_id if body.run_id is None else None,
        event=body.event,
        metric_key=body.metric if body.event == "metric" else None,
        comparison=body.comparison if body.event == "metric" else None,
        threshold=body.threshold if body.comparison in ("below", "above") else None,
        stall_s=(body.stall_minutes or DEFAULT_STALL_MINUTES) * 60
        if body.event == "stalled"
        else None,
        webhook_url=body.webhook,
        webhook_format=body.format,
    )
    session.add(rule)
    session.commit()
    return rule_view(session, rule)


def _check_fields(body: AlertRuleCreate, settings: Settings) -> None:
    errors: list[dict[str, Any]] = []

    def refuse(field: str, message: str) -> None:
        errors.append({"type": "value_error", "loc": ("body", field), "msg": message})

    if body.run_id is not None and body.study_id is not None:
        refuse("study_id", "give run_id or study_id, not both")
    if body.event == "metric":
        if body.metric is None:
            refuse("metric", "a metric alert names its metric, e.g. eval/accuracy")
        if body.comparison is None:
            refuse("comparison", "a metric alert says below, above or nonfinite")
        elif body.comparison != "nonfinite" and body.threshold is None:
            refuse("threshold", f"a '{body.comparison}' alert needs a threshold")
        elif body.comparison == "nonfinite" and body.threshold is not None:
            refuse("threshold", "a 'nonfinite' alert takes no threshold")
    else:
        for field in ("metric", "comparison", "threshold"):
            if getattr(body, field) is not None:
                refuse(field, f"only a metric alert takes {field} (event is {body.event!r})")
    if body.stall_minutes is not None and body.event != "stalled":
        refuse(
            "stall_minutes", f"only a stalled alert takes stall_minutes (event is {body.event!r})"
        )
    try:
        webhooks.check_url(body.webhook, settings)
    except webhooks.WebhookRefused as exc:
        refuse("webhook", f"this webhook URL cannot be used: {exc}")
    if errors:
        raise InvalidInput(errors)


@router.get("", response_model=AlertRuleList)
def list_rules(
    user: CurrentUser, session: SessionDep, run_id: IdQuery = None, study_id: IdQuery = None
) -> dict[str, Any]:
    """The caller's rules (an admin's: everyone's); ``run_id``: those that watch that run (its
    own rules, its study's, its owner's), ``study_id``: that study's."""
    query = select(AlertRule).order_by(AlertRule.id)
    if not user.is_admin:
        query = query.where(AlertRule.owner_id == user.id)
    if study_id is not None:
        query = query.where(AlertRule.study_id == study_id)
    rules = session.scalars(query).all()
    if run_id is not None:
        rules = [r for r in rules if _watches(session, r, run_id)]
    return {"rules": [rule_view(session, r) for r in rules]}


def _watches(session: Session, rule: AlertRule, run_id: int) -> bool:
    return bool(session.scalar(select(Run.id).where(Run.id == run_id, alert_rules.in_scope(rule))))


NO_RULE = {404: "No such rule among the caller's (an admin's: anyone's)."}
BUDGET = {429: "The server's webhook calls for this minute are spent (Retry-After)."}


@router.delete("/{rule_id}", status_code=status.HTTP_204_NO_CONTENT, responses=refusals(NO_RULE))
def delete(rule_id: RuleId, user: CurrentUser, session: SessionDep) -> Response:
    """Delete a rule and what it fired (its pending deliveries are not sent)."""
    rule = _own_rule(session, rule_id, user)
    session.query(AlertFiring).filter(AlertFiring.rule_id == rule.id).delete()
    session.delete(rule)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{rule_id}/test", response_model=AlertTestOut, responses=refusals(NO_RULE | BUDGET))
def test(
    rule_id: RuleId, user: CurrentUser, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    """Call the rule's webhook once now with a test message (not retried): whether it took it,
    and what the call met."""
    rule = _own_rule(session, rule_id, user)
    if not webhooks.CALLS.take(settings.alert_per_minute):
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "this server made CONSPO_ALERT_PER_MINUTE webhook calls in the last minute; retry"
            " in a minute",
            headers={"Retry-After": "60"},
        )
    alert = webhooks.Alert(
        id=0,
        rule_id=rule.id,
        rule_name=rule.name,
        run_id=rule.run_id or 0,
        run_name="",
        event="test",
        message=f"ConSPO Lab: a test of alert rule #{rule.id} {rule.name!r} ({describe(rule)})",
        step=None,
        value=None,
        metric=rule.metric_key,
        link=run_link(settings, rule.run_id) if rule.run_id else None,
    )
    url, fmt = rule.webhook_url, rule.webhook_format
    session.commit()
    outcome = webhooks.send(url, webhooks.payload(alert, fmt), settings)  # type: ignore[arg-type]
    return {"delivered": outcome.delivered, "error": outcome.error}


@router.get("/firings", response_model=AlertFiringList)
def firings(
    user: CurrentUser,
    session: SessionDep,
    run_id: IdQuery = None,
    rule_id: IdQuery = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    """What the caller's rules fired (an admin's: everyone's), newest first."""
    query = (
        select(AlertFiring, AlertRule.name)
        .join(AlertRule, AlertRule.id == AlertFiring.rule_id)
        .order_by(AlertFiring.id.desc())
        .limit(limit)
    )
    if not user.is_admin:
        query = query.where(AlertRule.owner_id == user.id)
    if run_id is not None:
        query = query.where(AlertFiring.run_id == run_id)
    if rule_id is not None:
        query = query.where(AlertFiring.rule_id == rule_id)
    out = []
    for firing, rule_name in session.execute(query).all():
        out.append(
            {
                "id": firing.id,
                "rule_id": firing.rule_id,
                "rule_name": rule_name,
                "run_id": firing.run_id,
                "event": firing.event,
                "message": firing.message,
                "step": firing.step,
                "value": firing.value,
                "created_at": firing.created_at,
                "state": firing.state,
                "attempts": firing.attempts,
                "next_attempt_at": firing.next_attempt_at if firing.state == "pending" else None,
                "delivered_at": firing.delivered_at,
                "last_error": firing.last_error,
            }
        )
    return {"firings": out}


def _own_rule(session: Session, rule_id: int, user: User) -> AlertRule:
    rule = session.get(AlertRule, rule_id)
    if rule is None or not (user.is_admin or rule.owner_id == user.id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"alert rule {rule_id} not found")
    return rule


def describe(rule: AlertRule) -> str:
    """The rule in words: "eval/accuracy below 0.2", "failed", "stalled 10 min"."""
    if rule.event == "metric":
        if rule.comparison == "nonfinite":
            return f"{rule.metric_key} not finite"
        return f"{rule.metric_key} {rule.comparison} {rule.threshold:g}"
    if rule.event == "stalled":
        return f"stalled {(rule.stall_s or 0) / 60:g} min"
    return str(rule.event)


def rule_view(session: Session, rule: AlertRule) -> dict[str, Any]:
    counts = session.execute(
        select(
            func.count(),
            func.sum(case((AlertFiring.state == "delivered", 1), else_=0)),
            func.sum(case((AlertFiring.state == "failed", 1), else_=0)),
        ).where(AlertFiring.rule_id == rule.id)
    ).one()
    if rule.run_id is not None:
        scope = f"run #{rule.run_id}"
    elif rule.study_id is not None:
        scope = f"study #{rule.study_id}"
    else:
        scope = "every run of its owner"
    owner = session.scalar(select(User.name).where(User.id == rule.owner_id))
    return {
        "id": rule.id,
        "name": rule.name,
        "owner": owner,
        "run_id": rule.run_id,
        "study_id": rule.study_id,
        "scope": scope,
        "event": rule.event,
        "metric": rule.metric_key,
        "comparison": rule.comparison,
        "threshold": rule.threshold,
        "stall_minutes": rule.stall_s / 60 if rule.stall_s is not None else None,
        "webhook": webhooks.redacted(rule.webhook_url),
        "format": rule.webhook_format,
        "created_at": rule.created_at,
        "fired": counts[0] or 0,
        "delivered": counts[1] or 0,
        "failed": counts[2] or 0,
    }
