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

Tool-use traces, ReTool's cold start (``tool``; the run lists the tool in ``tools.names``):

    kind_params: {batch_size: 16, tool: python}
    tools: [python]

each target becomes a trace: a call of the tool computing the answer (the task's
``tool_solution``), the tool's real output as the rollout would append it (the python tool runs
in the sandbox, a step's calls as one batch), then the target (``conspo.training.traces``). A
target holding ``<interpreter>`` blocks (these traces, or a dataset's) is trained on the model's
text only: the blocks are out of the loss, the token count and the accuracy. The run's
evaluation samples with the tool, so its final ``eval/tool_call_rate`` says how often the
fine-tuned model calls it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from conspo import metrics as M
from conspo.config import DatasetFields
from conspo.jobs.base import DatasetParams
from conspo.registry import Loc, register_job_kind
from conspo.templates import placeholders, render, template_problem
from conspo.training.traces import TraceTool

if TYPE_CHECKING:
    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.tasks import Example
    from conspo.training.loop import TrainResult, TrainState


class SFTParams(DatasetParams):
    # path: the problems (columns chosen by fields); none: the task's training problems
    fields: DatasetFields = Field(
        default_factory=DatasetFields,
        description="Which columns of path hold the question and answer.",
    )
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
    tool: TraceTool | None = Field(
        None,
        description="Teach calling this tool (ReTool's cold start; list it in tools.names too):"
        " each target becomes a trace that calls it with an expression computing the answer"
        " (the task's tool_solution; a problem without one is skipped), the tool's real output"
        " as <interpreter>…</interpreter> (out of the loss), then the target. The task's own"
        " problems only (no path). None: plain answers.",
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

    @model_validator(mode="after")
    def _traces_from_the_task(self) -> SFTParams:
        if self.tool is not None and self.path is not None:
            raise ValueError(
                "tool traces are built from the task's own problems (its tool_solution): drop"
                " path, or tool (a dataset's targets may hold <interpreter> blocks already)"
            )
        return self


def tool_problems(config: RunConfig) -> list[tuple[Loc, str, object]]:
    """What tool traces (kind_params.tool) need of the run, each problem at kind_params.tool:
    the tool in tools.names (evaluation then samples with it), and a task that provides
    ``tool_solution`` with problems that have one (``tool_solutions_missing``)."""
    from conspo.registry import TASKS, task_names

    tool = config.typed("kind_params", SFTParams).tool
    if tool is None:
        return []
    loc = ("kind_params", "tool")
    problems: list[tuple[Loc, str, object]] = []
    if tool not in config.tools.names:
        listed = ", ".join(config.tools.names) or "none"
        message = (
            f"tool {tool!r} must be listed in tools.names (now: {listed}), so that the run's"
            " evaluation samples with it and reports eval/tool_call_rate"
        )
        problems.append((loc, message, tool))
    task = TASKS.get(config.task.name).cls
    if not hasattr(task, "tool_solution"):
        able = [n for n in task_names() if hasattr(TASKS.get(n).cls, "tool_solution")]
        message = (
            f"task {config.task.name!r} provides no tool_solution() to build traces with;"
            f" tasks that do: {', '.join(able)}"
        )
        problems.append((loc, message, tool))
    elif (missing := getattr(task, "tool_solutions_missing", None)) is not None:
        why = missing(config.task.task_params())
        if why is not None:
            problems.append((loc, f"task {config.task.name!r}: {why}", tool))
    return problems


@register_job_kind(
    "sft",
    params=SFTParams,
    description="Supervised fine-tuning on reference answers (loss on answer tokens only): the"
    " problems of kind_params.path (columns chosen by kind_params.fields), or without one the"
    " task's training problems, optionally as tool-use traces (kind_params.tool: a call, the"
    " tool's real output, out of the loss, then the answer).",
    metrics=(M.LOSS, M.GRAD_NORM, M.SFT_TOKEN_ACC, M.SFT_TOKENS),
    example_params={"batch_size": 4},  # the task's own problems: no dataset to provide
    check=tool_problems,
)
def train_sft(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    return run_loop(config, *args, start=one_update_per_step(start), **kwargs)


def start(state: TrainState, files: DataFiles, store: ModelStore) -> Any:
    from conspo.sandbox import require_sandbox
    from conspo.tasks.datasets import load_problems
    from conspo.tasks.prompts import PromptRenderer
    from conspo.tools import make_toolbox
    from conspo.training.loop import optimiser_step, step_seed
    from conspo.training.sft import answer_loss, answer_rows
    from conspo.training.traces import tool_traces

    cfg = state.cfg
    params = cfg.typed("kind_params", SFTParams)
    prompt = PromptRenderer(cfg.prompt, state.tokenizer)
    problems: list[Example] | None = None
    if params.path is not None:
        problems = load_problems(files, params.path, params.fields, ("train",))
        if not problems:
            raise ValueError(f"kind_params.path: {params.path} holds no problems")
    # the run's own tool limits; setup has refused a machine without a sandbox already
    box = None
    if params.tool is not None:
        box = make_toolbox(cfg.tools, unsafe_local=require_sandbox(cfg.code_execution()))

    def targets(rng: random.Random, n: int) -> list[tuple[Example, str]]:
        """n of the task's training problems (prompts rendered) and their targets."""
        drawn = state.task.train_prompts(rng, n)
        return [(ex, render(params.target, {"answer": ex.answer})) for ex in drawn]

    def batch(step: int) -> list[tuple[str, str]]:
        rng = random.Random(step_seed(cfg.seed, step, "sft"))
        if box is not None and params.tool is not None:
            traced = tool_traces(state.task, targets, box, params.tool, rng, params.batch_size)
            return [(ex.prompt, trace) for ex, trace in traced]
        if problems is None:  # the task's training split, its prompts already rendered
            return [(ex.prompt, target) for ex, target in targets(rng, params.batch_size)]
        drawn = [problems[rng.randrange(len(problems))] for _ in range(params.batch_size)]
        return [(prompt(ex.prompt), render(params.target, {"answer": ex.answer})) for ex in drawn]

    def step(step: int) -> dict[str, float]:
        max_tokens = params.max_tokens if params.packing else 0
        ids, mask, labels = answer_rows(state.tokenizer, batch(step), state.device, max_tokens)
        loss, hit, n = answer_loss(state.model, ids, mask, labels)
        grad_norm = optimiser_step(state, loss)
        return {
            M.LOSS: loss.item(),
            M.GRAD_NORM: grad_norm,
            M.SFT_TOKEN_ACC: hit.item(),
            M.SFT_TOKENS: float(n),
        }

    return step
