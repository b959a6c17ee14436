"""An example ConSPO Lab plugin: importing it registers what it adds.

    pip install -e examples/plugins/conspo_example_plugin   # then restart the API and workers
    # or, with no install: CONSPO_PLUGINS=conspo_example_plugin (on PYTHONPATH)

A run then names them like built-ins: ``task: {name: count_letter}`` and
``rewards: [{name: verifier}, {name: brevity, weight: 0.1}]``; its environment is played as
``task: {name: environment, params: {environment: nim}}``, with
``rewards: [{name: verifier}, {name: few_turns, weight: 0.1}]``.
"""

from conspo_example_plugin import environments, rewards, tasks

__version__ = "0.1.0"
__all__ = ["environments", "rewards", "tasks"]
