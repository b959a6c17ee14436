"""An example ConSPO Lab plugin: importing it registers what it adds.

    pip install -e examples/plugins/conspo_example_plugin   # then restart the API and workers
    # or, with no install: CONSPO_PLUGINS=conspo_example_plugin (on PYTHONPATH)

A run then names them like built-ins: ``task: {name: count_letter}`` and
``rewards: [{name: verifier}, {name: brevity, weight: 0.1}]``; its environment is played as
``task: {name: environment, params: {environment: nim}}``, with
``rewards: [{name: verifier}, {name: few_turns, weight: 0.1}]``. ``trl_env.GuessEnv`` is a TRL
``environment_factory`` class, played unchanged as ``environment: trl`` with
``environment_params: {entry_point: "conspo_example_plugin.trl_env:GuessEnv"}``.
"""

from conspo_example_plugin import environments, rewards, tasks

__version__ = "0.1.0"
__all__ = ["environments", "rewards", "tasks"]
