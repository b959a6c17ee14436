"""ConSPO Lab's training library: ``train(config, sink, should_stop, workdir=...)``.

A pure library (no web framework, no database): a ``RunConfig`` goes in, one ``StepRecord`` per
step comes out through a ``Sink``. ``python -m conspo train run.yaml --out DIR`` runs it alone.
"""

from typing import Any

from conspo.config import RunConfig

__all__ = ["ModelStore", "RunConfig", "TrainResult", "train"]


def __getattr__(name: str) -> Any:
    # Lazy: `import conspo` (e.g. for RunConfig in the API) must not import torch/transformers.
    if name in ("train", "TrainResult"):
        from conspo.training import trainer

        return getattr(trainer, name)
    if name == "ModelStore":
        from conspo.models.store import ModelStore

        return ModelStore
    raise AttributeError(f"module 'conspo' has no attribute {name!r}")
