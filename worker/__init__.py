"""The Celery worker: runs ``conspo.train`` for queued runs and writes their steps to the DB."""
