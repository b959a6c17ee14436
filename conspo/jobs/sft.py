"""The ``sft`` job kind: supervised fine-tuning on reference answers, the loss on answer tokens.

    kind: sft
    kind_params: {path: data/math/gsm8k.jsonl, batch_size: 16, target: "\\\\boxed{{{answer}}}"}

Each step takes ``batch_size`` problems: from ``path`` (a local dataset read with ``datasets``,
columns chosen by ``fields``) or, without a path, from the task's training split. The question
is rendered as every run renders prompts (``config.prompt``: the template, and the tokenizer's
chat template when it has one), the target is ``target`` filled with the reference answer, then
EOS; cross-entropy counts the target's tokens only (prompt and padding are masked out), averaged
over the batch's target tokens. LoRA or full fine-tuning is ``model.lora`` as for RL; ``packing``
concatenates examples into rows of at most ``max_tokens`` tokens
(``conspo.training.sft.answer_rows``).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conspo import metrics as M
from conspo.config import DatasetFields
from conspo.input_checks import Label
from conspo.lazy import lazy_import
from conspo.registry import register_job_kind
from conspo.templates import placeholders, render, template_problem

if TYPE_CHECKING:
    import torch

    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.tasks import Example
    from conspo.training.loop import TrainResult, TrainState
else:
    torch = lazy_import("torch")


class SFTParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # the fields naming a dataset (file or directory) in the data roots: checked at submit time
    # like a task's (backend.runs.inputs), read through DataFiles.check_path here
    data_paths: ClassVar[tuple[str, ...]] = ("path",)
    dataset_dirs: ClassVar[bool] = True

    path: Label | None = Field(
        None,
        max_length=1000,
        description="A local dataset (parquet, jsonl, json, arrow, or a save_to_disk directory)"
        " inside the data roots; none: the task's training problems.",
    )
    fields: DatasetFields = Field(default_factory=DatasetFields)
    target: str = Field(
        "{answer}",
        min_length=1,
        max_length=2000,
        description="What the model is taught to answer, holding {answer} (the reference"
        " answer), e.g. \\boxed{{{answer}}}; other braces doubled.",
    )
    batch_size: int = Field(16, ge=1, le=4096, description="Examples per step.")
    packing: bool = Field(
        False,
        description="Concatenate examples into rows of at most max_tokens tokens (less padding;"
        " a packed example attends to the earlier ones in its row).",
    )
    max_tokens: int = Field(
        512, ge=8, le=1_000_000, description="Row length when packing (tokens)."
    )

    @field_validator("target")
    @classmethod
    def _target_holds_the_answer(cls, target: str) -> str:
        problem = template_problem(target, ("answer",))
        if problem is not None:
            raise ValueError(f"must hold {{answer}}, other braces doubled: {problem}")
        if "answer" not in placeholders(target, ("answer",)):
            raise ValueError("must hold {answer}")
        return target


@register_job_kind(
    "sft",
    params=SFTParams,
    description="Supervised fine-tuning on reference answers (loss on answer tokens only).",
    metrics=(M.LOSS, M.GRAD_NORM, M.SFT_TOKEN_ACC, M.SFT_TOKENS),
)
def train_sft(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    return run_loop(config, *args, start=one_update_per_step(start), **kwargs)


def start(state: TrainState, files: DataFiles, store: ModelStore) -> Any:
    from conspo.tasks.datasets import load_problems
    from conspo.tasks.prompts import PromptRenderer
    from conspo.training.loop import optimiser_step, step_seed
    from conspo.training.sft import answer_rows

    cfg = state.cfg
    params = cfg.typed("kind_params", SFTParams)
    prompt = PromptRenderer(cfg.prompt, state.tokenizer)
    problems: list[Example] | None = None
    if params.path is not None:
        problems = load_problems(files, params.path, params.fields, ("train",))
        if not problems:
            raise ValueError(f"kind_params.path: {params.path} holds no problems")

    def batch(step: int) -> list[tuple[str, str]]:
        rng = random.Random(step_seed(cfg.seed, step, "sft"))
        if problems is None:  # the task's training split, its prompts already rendered
            drawn = state.task.train_prompts(rng, params.batch_size)
            return [(ex.prompt, render(params.target, {"answer": ex.answer})) for ex in drawn]
        drawn = [problems[rng.randrange(len(problems))] for _ in range(params.batch_size)]
        return [(prompt(ex.prompt), render(params.target, {"answer": ex.answer})) for ex in drawn]

    def step(step: int) -> dict[str, float]:
        max_tokens = params.max_tokens if params.packing else 0
        ids, mask, labels = answer_rows(state.tokenizer, batch(step), state.device, max_tokens)
        logits = state.model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        targets = labels[:, 1:]
        scored = targets != -100
        n = scored.sum()
        nll = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), targets, ignore_index=-100, reduction="sum"
        )
        loss = nll / n
        hit = ((logits.argmax(-1) == targets) & scored).sum() / n
        grad_norm = optimiser_step(state, loss)
        return {
            M.LOSS: loss.item(),
            M.GRAD_NORM: grad_norm,
            M.SFT_TOKEN_ACC: hit.item(),
            M.SFT_TOKENS: float(n),
        }

    return step
