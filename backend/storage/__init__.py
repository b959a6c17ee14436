"""Metric and rollout storage: idempotent bulk writes and server-side downsampled reads.

* ``writes``: ``write_points``, one transaction's bulk upsert of metrics and rollouts plus the
  run's step, summary and write sequence.
* ``series``: ``query_series`` (bucketed by step above ``max_points``, min and max kept per
  bucket) and the ``metric_rollups`` cache it reads and fills; ``cached_series``, the API's
  reads through a per-process cache keyed by each run's write sequence; ``metric_keys``.
* ``stream``: ``StreamCursor`` and ``query_new_points``, the live stream's write-sequence cursor.
* ``rollouts``: ``query_rollouts`` and ``stored_texts``, one rollout each out of the per-step
  rows of arrays.
* ``prompts``: per-prompt pass rates, written with their step by ``write_points`` and read as
  ``prompt_difficulty`` (pass-rate bands and learned / forgotten counts per step).
* ``dialect``: the strategy behind every statement whose SQL differs between dialects, one
  object per engine: ``sqlite.SqliteDialect`` and ``postgresql.PostgresDialect`` (which sends
  columns as the binary arrays of ``pg_arrays``).
"""
