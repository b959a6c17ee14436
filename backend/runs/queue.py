"""Handing runs to the Celery queue (the backend only sends; worker/ consumes).

``JobQueue.publish`` is the only place a training job is sent; ``backend.runs.lifecycle.send``
calls it as part of the queued run's hand-over, to the queue of the run's capacity class
(``backend.runs.scheduling``: ``gpu``, ``gpu-N``, ``gpu-ray``). ``JobQueue.waiting`` counts the
jobs in one queue, so the reaper and ``/api/health`` can tell when the broker lost some
(``lifecycle.stranded``).
"""

from __future__ import annotations

from dataclasses import dataclass

from celery import Celery

from backend.config import Settings
from backend.runs.scheduling import queue_for
from conspo.config import ResourcesConfig

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


@dataclass(frozen=True)
class JobQueue:
    """Where training jobs go: a Celery app and the base queue its GPU workers consume (runs
    needing more than one process go to queues named after it, ``backend.runs.scheduling``)."""

    celery: Celery
    queue: str

    @classmethod
    def from_settings(cls, settings: Settings, celery: Celery | None = None) -> JobQueue:
        return cls(celery or make_celery(settings), settings.queue)

    def queue_for(self, resources: ResourcesConfig) -> str:
        return queue_for(resources, self.queue)

    def publish(self, run_id: int, resources: ResourcesConfig | None = None) -> None:
        """Send the job for ``run_id`` to the queue of workers that can hold ``resources``
        (raises when the broker is down)."""
        self.celery.send_task(
            TASK_NAME, args=[run_id], queue=self.queue_for(resources or ResourcesConfig())
        )

    def waiting(self, queue: str | None = None) -> int:
        """Jobs in ``queue`` (default: the base queue) not yet delivered to a worker (raises
        when the broker is down).

        Both transports count the same thing: Redis the queue's lists, kombu's SQLAlchemy
        transport its visible message rows; a job a worker holds unacknowledged is not counted.
        """
        with self.celery.connection_for_read() as conn:
            declared = conn.default_channel.queue_declare(queue=queue or self.queue, passive=False)
            return int(declared.message_count)
