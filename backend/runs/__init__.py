"""The run domain: making, checking, routing, sending and moving runs through their states.

* ``lifecycle``: every change of a run's status (the only writer of ``runs.status``), with the
  ``on_finished`` hooks the rooms above register (a pipeline's next stage: ``backend.pipelines``);
* ``rows``: the one constructor of a queued run (``new_run``) and the unique names runs get;
* ``submit``: the submit-time checks of every route that accepts a run config (``refuse_unfit``),
  on ``inputs`` (files, models, memory, software a config names, bounded by the settings) and
  ``chaining`` (the runs a config starts from);
* ``scheduling``: a run's capacity class and queue, and why a queued run waits;
* ``queue``: the Celery app and ``JobQueue``, the one place a job is sent.

Below storage, studies, pipelines and the API: nothing here imports them (``tests/lab/
test_import_graph.py`` holds the order of the rooms).
"""
