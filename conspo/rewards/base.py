"""What every reward shares: the context a reward reads, its parameter base, the failure it may
raise, and scoring a batch of rollouts with the configured rewards.

    rewards = build_rewards(cfg.rewards)
    scores = score_rollouts(rewards, texts, examples, lengths, RewardContext(task, 16))

A run lists its rewards in ``RunConfig.rewards`` (``[{name, weight, params}]``); the reward the
objective sees is the shaped reward R = Σ weight · reward (docs/objectives.md §7), and each
reward's mean over the step's rollouts is logged as ``reward/<name>``. ``verifier`` is the task's
verify, the verified outcome O: every run has it (the config adds it with weight 1 when it is not
listed), and O alone decides who is positive, whatever the other rewards and the weights are.
Pure Python on strings, no torch: the API validates configs against the parameter models.

A reward is user code (a plugin registers its own, and a user's task brings its own verify), so
scoring contains it: a rollout whose reward raises, or returns no finite number, fails that
reward alone (scored 0, counted in ``RewardScores.failed``, the first reason logged once per
step), and a batched reward whose call fails fails its whole batch. A cancel and the device
running out of memory are the run's, not a rollout's: they still end the step.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from conspo.registry import get_job_kind, get_reward
from conspo.stopping import Abandoned
from conspo.tasks.base import Example, Task, Verifier, prefetch

if TYPE_CHECKING:
    from conspo.config import RewardConfig, RunConfig

log = logging.getLogger(__name__)

VERIFIER = "verifier"  # the reward whose value is the verified outcome (conspo.rewards.verifier)
BOXED = "\\boxed{"  # the answer's marker, which format and info_gain both look for
REASON_CHARS = 300  # a failure's reason is cut to this: one log line, not a page of repr


# (rows, contexts, continuations) → for each row, the mean log π(continuation | the row's prompt
# followed by context), at the sampling temperature, without grad.
ContinuationScorer = Callable[[Sequence[int], Sequence[str], Sequence[str]], list[float]]


class RewardModels(Protocol):
    """The models a run's rewards call, each loaded once per run (``conspo.models.scoring
    .ModelScorers``, which the trainer builds at set-up from the run's model store), so that a
    reward calling a model stays torch-free at import: ``score`` for a sequence-score model,
    ``generate`` for a generative judge."""

    def score(
        self,
        name: str,
        prompts: Sequence[str],
        completions: Sequence[str],
        *,
        max_tokens: int,
        batch_size: int,
        deadline: float,
    ) -> list[float]:
        """The score model ``name``'s scalar for each (prompt, completion), NaN included,
        ``batch_size`` at a time, each text cut to ``max_tokens``; a ``TimeoutError`` once
        ``time.monotonic()`` passes ``deadline``, ``Abandoned`` on a cancel."""
        ...

    def generate(
        self,
        name: str,
        prompts: Sequence[str],
        *,
        samples: int,
        temperature: float,
        max_new_tokens: int,
        max_prompt_tokens: int,
        batch_size: int,
        deadline: float,
        seed: int,
    ) -> list[list[str]]:
        """The causal LM ``name``'s ``samples`` texts for each prompt (the user's turn in its
        chat template, cut to ``max_prompt_tokens`` from its left), each at most
        ``max_new_tokens`` tokens, drawn from ``seed``; a ``TimeoutError`` past ``deadline``,
        ``Abandoned`` on a cancel."""
        ...


@dataclass(frozen=True)
class RewardContext:
    """What a reward may need beyond the completion and its example."""

    task: Task
    max_new_tokens: int  # the response cap L_max
    # this rollout's response tokens, EOS included, the model's own only: a tool's output is
    # not counted (as in len/*); per-rollout rewards
    length: int = 0
    group_size: int = 1  # rows [i*G, (i+1)*G) share a prompt (batched rewards)
    continuation_logprob: ContinuationScorer | None = None  # the policy, for batched rewards
    models: RewardModels | None = None  # the models rewards call (None: the rewards call none)


# How a reward calls the model a params field names: a sequence-score model's ``score``, or a
# causal LM's ``generate`` (a judge). A params model says so in its ``model_use`` ClassVar.
ModelUse = Literal["score", "generate"]


def model_uses(cfg: RunConfig) -> list[tuple[tuple[str | int, ...], str, ModelUse]]:
    """(location, name, use) of each model the run's rewards name (a reward's params model
    lists its fields that name one in ``model_names``: reward_model's ``model``; and how it
    calls them in ``model_use``, "score" unless it says), when the run's job kind scores
    rewards: what the trainer loads at set-up."""
    if "rewards" not in get_job_kind(cfg.kind).sections:
        return []
    found: list[tuple[tuple[str | int, ...], str, ModelUse]] = []
    for i, spec in enumerate(cfg.rewards):
        params = spec.reward_params()
        use: ModelUse = getattr(type(params), "model_use", "score")
        for name in getattr(type(params), "model_names", ()):
            found.append((("rewards", i, "params", name), getattr(params, name), use))
    return found


def model_fields(cfg: RunConfig) -> list[tuple[tuple[str | int, ...], str]]:
    """(location, name) of each model the run's rewards name (``model_uses``): what the API
    checks at submit, as it checks model.name."""
    return [(loc, name) for loc, name, _use in model_uses(cfg)]


def field_name(loc: Sequence[str | int]) -> str:
    """A config location as people write it: ("rewards", 1, "params", "model") →
    rewards[1].params.model."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


class RewardFailed(Exception):
    """A reward that could not be computed for one rollout: the rollout gets 0 from it, and
    ``score_rollouts`` counts and logs such rollouts per reward, with this message as the
    reason. Any other exception counts the same, reported with its type (a bug, not a verdict).
    A batched reward fails one rollout alone by returning one as that rollout's value."""


# A critique is kept with its rollout at most this long: a judge's text bounded by its
# max_new_tokens may still be pages; the stored sample is for reading, not for replaying.
CRITIQUE_CHARS = 2000


@dataclass(frozen=True)
class Critiqued:
    """A batched reward's value for one rollout (a number, or ``RewardFailed``) with the text
    that decided it (a judge's critique): ``score_rollouts`` keeps the text with the rollout
    (``RewardScores.critiques``), cut to ``CRITIQUE_CHARS``. A vector reward also gives its
    named dimensions' values (each logged as ``reward/<reward>.<dimension>``): the names its
    params list in ``dimension_names``."""

    value: object
    critique: str
    dimensions: Mapping[str, float] = field(default_factory=dict)


class RewardParams(BaseModel):
    """Base of every reward's parameter model: unknown keys are errors, as in the whole config."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --------------------------------------------------------------------------------------------
# Scoring a batch of rollouts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightedReward:
    name: str
    weight: float
    fn: Callable[..., Any]  # per rollout, or batched (``batched``)
    params: BaseModel
    batched: bool = False


def build_rewards(specs: Sequence[RewardConfig]) -> list[WeightedReward]:
    """The configured rewards, their parameters resolved (the config already validated them)."""
    built = []
    for spec in specs:
        registered = get_reward(spec.name)
        params = spec.reward_params()
        weight = registered.default_weight if spec.weight is None else spec.weight
        built.append(WeightedReward(spec.name, weight, registered.fn, params, registered.batched))
    return built


@dataclass(frozen=True)
class RewardScores:
    """Per rollout: the verified outcome, each reward, and their weighted sum."""

    outcome: list[float]
    # reward → its value per rollout; a vector reward's dimensions as "<reward>.<dimension>"
    # beside it (logged as every part is; a failed rollout's are 0, as its value is)
    parts: dict[str, list[float]]
    shaped: list[float]
    failed: dict[str, int] = field(default_factory=dict)  # reward → rollouts it failed on
    # reward → why it failed, its first failure of the batch: an exception's type and message,
    # or what it returned instead of a number
    reasons: dict[str, str] = field(default_factory=dict)
    # per rollout: whether any of its rewards failed (it lost that reward: scored 0)
    lost: list[bool] = field(default_factory=list)
    # per rollout: the critique a reward gave with its value (``Critiqued``: a judge's text),
    # the first reward's that gave one; None where none did
    critiques: list[str | None] = field(default_factory=list)


def score_rollouts(
    rewards: Sequence[WeightedReward],
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
) -> RewardScores:
    """Every reward of every rollout; ``rewards`` must hold the verifier (the config adds it).
    The task first sees the whole batch (its optional ``prefetch``: the code task runs the
    batch's sandboxes together). A reward that fails on a rollout scores it 0 (the module
    docstring); ``Abandoned`` and the device's out-of-memory error propagate."""
    parts: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    reasons: dict[str, str] = {}
    lost = [False] * len(completions)
    critiques: list[str | None] = [None] * len(completions)
    prefetch(context.task, completions, examples)
    for reward in rewards:
        score = _score_batch if reward.batched else _score_each
        parts[reward.name], each, texts, dimensions = score(
            reward, completions, examples, lengths, context
        )
        parts |= {f"{reward.name}.{name}": values for name, values in dimensions.items()}
        lost = [was or why is not None for was, why in zip(lost, each, strict=True)]
        critiques = [
            was if was is not None else new for was, new in zip(critiques, texts, strict=True)
        ]
        failures = [why for why in each if why is not None]
        if failures:
            failed[reward.name], reasons[reward.name] = len(failures), failures[0]
            log.warning(
                "reward %s failed on %d of %d rollouts (scored 0): %s",
                reward.name, len(failures), len(completions), failures[0],
            )  # fmt: skip
    shaped = [sum(r.weight * parts[r.name][i] for r in rewards) for i in range(len(completions))]
    return RewardScores(
        outcome=parts[VERIFIER],
        parts=parts,
        shaped=shaped,
        failed=failed,
        reasons=reasons,
        lost=lost,
        critiques=critiques,
    )


# A reward's scores, per rollout why it failed (None: it did not), per rollout the critique it
# gave (None: none), and its dimensions' scores by name (a vector reward's; else empty).
Scored = tuple[list[float], list[str | None], list[str | None], dict[str, list[float]]]


def _score_each(
    reward: WeightedReward,
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
) -> Scored:
    """One call per rollout: a rollout whose call raises or returns no number fails alone."""
    values: list[float] = []
    failures: list[str | None] = []
    for text, example, n in zip(completions, examples, lengths, strict=True):
        try:
            returned = reward.fn(text, example, replace(context, length=n), reward.params)
            values.append(_as_score(returned))
            failures.append(None)
        except Exception as exc:
            if _ends_the_step(exc):
                raise
            values.append(0.0)
            failures.append(_reason(exc))
    return values, failures, [None] * len(values), {}


def _score_batch(
    reward: WeightedReward,
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
) -> Scored:
    """One call for the batch: a call that raises, or returns no sequence of one value per
    rollout, fails every rollout (no value can be told apart from its neighbours'); a value
    that is no number, or a ``RewardFailed``, fails its own rollout. A ``Critiqued`` value's
    critique is kept (cut), whether its value counts or not."""
    n = len(completions)
    # every step has every dimension, failed or not: rounds and steps stack by name
    dimensions = {name: [0.0] * n for name in getattr(reward.params, "dimension_names", ())}
    try:
        returned = reward.fn(completions, examples, lengths, context, reward.params)
        each = _one_per_rollout(returned, n)
    except Exception as exc:
        if _ends_the_step(exc):
            raise
        return [0.0] * n, [_reason(exc)] * n, [None] * n, dimensions
    values: list[float] = []
    failures: list[str | None] = []
    critiques: list[str | None] = []
    for row, value in enumerate(each):
        critique = None
        given: Mapping[str, float] = {}
        if isinstance(value, Critiqued):
            critique = _cut(str(value.critique), CRITIQUE_CHARS)
            given = value.dimensions
            value = value.value
        critiques.append(critique)
        try:
            if isinstance(value, RewardFailed):
                raise value
            values.append(_as_score(value))
            failures.append(None)
        except Exception as exc:  # its own __float__ may raise anything
            if _ends_the_step(exc):
                raise
            values.append(0.0)
            failures.append(_reason(exc))
            continue
        for name in dimensions:
            with contextlib.suppress(Exception):  # a dimension not given, or no number: 0
                dimensions[name][row] = _as_score(given[name])
    return values, failures, critiques, dimensions


def _one_per_rollout(returned: object, n: int) -> list[object]:
    # A string is iterable, and would pass as its characters.
    if isinstance(returned, str | bytes) or not isinstance(returned, Iterable):
        raise RewardFailed(f"returned {_shown(returned)}, not a list of {n} numbers")
    values = list(returned)
    if len(values) != n:
        raise RewardFailed(f"returned {len(values)} values for {n} rollouts")
    return values


def _as_score(value: object) -> float:
    """``value`` as a reward: a finite real number, or ``RewardFailed``. Whatever ``float``
    takes counts (an int, a numpy or one-element torch scalar), and so does a bool, as 1.0 or
    0.0: a verifier-like reward returns whether the answer is right, as a task's verify may,
    and refusing it would fail every rollout of a correct reward. A string is refused although
    ``float`` parses "0.5": a reward that returns text is a bug, not a score."""
    number = math.nan
    if not isinstance(value, str | bytes | bytearray):
        # None, a list, a 2-element tensor: no number
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            number = float(value)  # type: ignore[arg-type]  # anything may come back
    if not math.isfinite(number):
        raise RewardFailed(f"returned {_shown(value)}, not a finite number")
    return number


def _shown(value: object) -> str:
    text = repr(value)
    return f"{text if len(text) <= 80 else text[:79] + '…'} ({type(value).__name__})"


def _reason(exc: Exception) -> str:
    """A ``RewardFailed`` says why in its message; any other exception is named by its type."""
    why = str(exc) if isinstance(exc, RewardFailed) else f"{type(exc).__name__}: {exc}"
    return _cut(why, REASON_CHARS)


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def contained_verify(task: Verifier, completion: str, example: Example) -> tuple[float, str | None]:
    """(``task.verify``'s outcome, None), or (0.0, why) when it raised or gave no finite
    number: a held-out answer is verified as a training rollout is (``score_rollouts``)."""
    try:
        return _as_score(task.verify(completion, example)), None
    except Exception as exc:
        if _ends_the_step(exc):
            raise
        return 0.0, _reason(exc)


def _ends_the_step(exc: Exception) -> bool:
    """Whether ``exc`` is the run's, not the rollout's, and must propagate: a cancel (a
    batched reward that reads the policy asks ``stopping.check`` between its layers) and the
    device out of memory (the training loop turns it into a message saying what to lower).
    torch is looked up, not imported, to keep this module torch-free: a process that never
    imported it has no device memory to run out of."""
    torch = sys.modules.get("torch")
    return isinstance(exc, Abandoned) or (
        torch is not None and isinstance(exc, torch.OutOfMemoryError)
    )
