"""Handing runs to the Celery queue (the backend only sends; worker/ consumes)."""

from __future__ import annotations

from celery import Celery
from sqlalchemy import update
from sqlalchemy.orm import Session

from backend.config import Settings
from backend.models import Run, RunStatus, utcnow

TASK_NAME = "worker.tasks.run_training"


def make_celery(settings: Settings) -> Celery:
    """The Celery app of both sides: acks late, prefetch 1, one queue for GPU jobs."""
    app = Celery("conspo", broker=settings.broker_url)
    options: dict[str, object] = {}
    if settings.broker_url.startswith("sqla+sqlite"):
        options = {"connect_args": {"timeout": 30}}
    elif settings.broker_url.startswith(("redis", "rediss")):
        # Our reaper re-queues runs of dead workers long before Redis would redeliver.
        options = {"visibility_timeout": 6 * 3600, "socket_connect_timeout": 5}
    app.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        task_default_queue=settings.queue,
        task_routes={TASK_NAME: {"queue": settings.queue}},
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_publish_retry=True,
        task_publish_retry_policy={
            "max_retries": 2,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 1,
        },
    )
    return app


def send_run(celery: Celery, settings: Settings, session: Session, run_id: int) -> None:
    """Publish the job and record that it was handed over (raises if the broker is down)."""
    celery.send_task(TASK_NAME, args=[run_id], queue=settings.queue)
    session.execute(
        update(Run)
        .where(Run.id == run_id, Run.status == RunStatus.queued)
        .values(enqueued_at=utcnow())
    )
    session.commit()
