"""Pipelines: stage configs submitted as one unit (SFT → RL, SFT → DPO → RL), stage k+1's run
created, starting from stage k's run, when stage k's run succeeds.

* ``stages``: the run of a stage and its release, once, in the transaction that finishes the
  stage before (``lifecycle.finish`` calls the hook ``install_hooks`` registers, which calls
  ``release_next_stage``); ``STOPPED``.
* ``service``: queue a pipeline (stage 0), send a released stage, cancel, and the view the API,
  the CLI and the page show (each stage's run, where it starts from, its evaluation).
"""
