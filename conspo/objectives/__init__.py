"""RLVR objectives, one module each (docs/objectives.md): ``grpo``, ``dapo``, ``dr_grpo``,
``conspo``, ``rloo``, ``gspo``, ``cispo``, ``gmpo``, ``sapo``, ``disco``, ``reinforce_pp``,
``mcpo``, ``ispo``; ``base`` holds what they share (``PolicyBatch``, ``ObjectiveOutput``, the
parameter base and the tensor pieces). Adding one: a new module here with a parameter model and
a function under ``@register_objective``; the registry imports every module of this package.
"""
