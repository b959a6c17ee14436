"""The built-in models' recipes: how each name of ``conspo.models.catalog`` is made, handed to the
model store as its builder.

    store = builtin_store()                   # ModelStore(..., builder=build_builtin)
    path = store.resolve("tiny-arith")        # tiny, then its SFT warm start, built once

`tiny` is conspo/models/tiny.py's, `tiny-chat` conspo/models/tiny_chat.py's, SmolLM2 comes from
its registry package (conspo/models/smollm2.py). The warm-started ones (`tiny-arith`, …,
`tiny-chat-math`) are their base after a short supervised warm start
(``conspo.training.sft``), so RL starts from a policy that is right part of the time. This is
the one module of ``conspo.models`` that trains: it sits above ``conspo.training.sft`` and below
the rest of ``conspo.training`` (tests/lab/test_import_graph.py), which is why the store is
handed it rather than importing it.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conspo.access import ModelSources
from conspo.config import TaskConfig
from conspo.models.catalog import BUILTIN_MODELS
from conspo.models.store import ModelStore
from conspo.models.tiny import save_tiny
from conspo.models.tiny_chat import WARM_START_PROMPT, save_tiny_chat
from conspo.tasks import make_task
from conspo.tasks.math_fixtures import easy_problems
from conspo.tasks.prompts import PromptRenderer
from conspo.training.sft import Pairs, sft, warm_start


def builtin_store(
    root: str | Path | None = None, sources: ModelSources | None = None
) -> ModelStore:
    """A model store that builds the built-ins (``ModelStore``'s arguments)."""
    return ModelStore(root, sources, builder=build_builtin)


def build_builtin(name: str, resolve: Callable[[str], Path]) -> Callable[[Path], object]:
    """How to write the built-in ``name`` into a directory; ``resolve(base)`` builds (once) and
    returns the built-in a warm start begins from."""
    entry = BUILTIN_MODELS[name]
    if entry.family == "smollm2":
        from conspo.models.smollm2 import save_smollm2

        return save_smollm2
    if entry.base is None:
        return save_tiny_chat if entry.family == "tiny-chat" else save_tiny
    base = resolve(entry.base)
    if entry.family == "tiny-chat":
        return lambda out: warm_start_chat(base, out, steps=entry.sft_steps)
    tasks = [TaskConfig.model_validate(t) for t in entry.warm_start]
    return lambda out: sft(base, tasks, out, steps=entry.sft_steps)


def warm_start_chat(base: Path, out: Path, *, steps: int, seed: int = 0) -> None:
    """Warm-start ``base`` on the easy word problems' training split
    (``conspo.training.sft.warm_start``): prompt rendered with ``WARM_START_PROMPT``, target
    "\\boxed{answer}" then <|im_end|>; 32 problems a step, lr 2e-3."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "easy.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in easy_problems()))
        task = make_task(TaskConfig(name="math", params={"path": str(path)}))

    def draw(rng: random.Random, tokenizer: Any) -> Pairs:
        render = PromptRenderer(WARM_START_PROMPT, tokenizer)
        drawn = task.train_prompts(rng, 32)
        return [(render(ex.prompt), f"\\boxed{{{ex.answer}}}") for ex in drawn]

    warm_start(base, out, draw, steps=steps, lr=2e-3, warmup=steps // 10, seed=seed)
