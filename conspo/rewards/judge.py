"""The ``judge`` reward: a generative judge's verdict on each rollout (a critique, then a score).

    rewards: [{name: verifier},
              {name: judge, params: {model: smollm2-135m-instruct, samples: 3, aggregate: median}}]

The judge is a causal LM named as ``model.name`` is (a catalogue model, a run's checkpoint in
the model store, a local directory: the same sources allow it), loaded once at set-up
(``conspo.models.scoring``) and called through the context's ``models``, so this module stays
torch-free. Its prompt is ``rubric`` with the task's own question and the rollout's answer, as
the user's turn in the judge's chat template; it writes ``samples`` judgements at
``temperature``, each at most ``max_new_tokens`` tokens, and each judgement's last ``Score: N``
line is its score (``parse_score``: case and spaces do not matter, "7/10" reads as seven out of
ten). The reward is the ``aggregate`` of the parsed scores over ``max_score``: in [0, 1].

A judgement with no score, or one out of range, is dropped; a rollout none of whose judgements
gives one fails alone, its reason quoting the judge's text. A call that runs past ``timeout_s``
fails the batch. The first judgement's text is kept with the rollout (its critique). OpenAI-
compatible remote judges are not here: the judge runs in the trainer's process.

A vector judge names its dimensions (``dimensions: [{name: correctness, weight: 2}, {name:
clarity}]``): the judge writes one ``name: N`` line each (the default rubric asks for them),
each dimension is aggregated over the judgements that give it and logged as
``reward/judge.<name>``, and the reward is their weighted mean over ``max_score``. A rollout
that gets no score for some dimension from any judgement fails, naming it.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from conspo.input_checks import Label
from conspo.registry import register_reward
from conspo.rewards.base import Critiqued, RewardContext, RewardFailed, RewardParams
from conspo.rewards.reward_model import question
from conspo.tasks.base import Example

DEFAULT_RUBRIC = (
    "You are grading an answer to a question.\n\n"
    "Question:\n{question}\n\n"
    "Answer:\n{answer}\n\n"
    "Is the answer correct and complete? Write a short critique (two or three sentences), then"
    ' end with a final line of the form "Score: N", where N is a whole number from 0 (wrong)'
    " to {max_score} (correct and complete)."
)
# The default rubric of a judge with dimensions: {dimensions} is one "name: N" line each.
DEFAULT_VECTOR_RUBRIC = (
    "You are grading an answer to a question.\n\n"
    "Question:\n{question}\n\n"
    "Answer:\n{answer}\n\n"
    "Write a short critique of the answer (two or three sentences), then end with one line per"
    " criterion below, N a whole number from 0 (worst) to {max_score} (best):\n{dimensions}"
)
PLACEHOLDERS = ("{question}", "{answer}")
QUOTED_CHARS = 120  # of the judge's text in a failed rollout's reason

# After the label: "Score: 7", "score : 7.5", "**Score:** 8", "SCORE: 7/10": the number, and its
# "out of" if any. One character class around the colon (spaces and markdown's stars), so a
# long run of either costs linear time, not a backtracking search between two quantifiers.
NUMBER_AFTER_LABEL = r"[\s*]*:[\s*]*([-+]?\d+(?:\.\d+)?)(?:[ \t]*/[ \t]*(\d+(?:\.\d+)?))?"


def score_line(label: str) -> re.Pattern[str]:
    """The line that gives ``label``'s score (a whole word: "correctness" is not read from
    "incorrectness")."""
    return re.compile(rf"(?<![\w-]){re.escape(label)}{NUMBER_AFTER_LABEL}", re.IGNORECASE)


SCORE_LINE = score_line("score")


class Dimension(BaseModel):
    """One named criterion of a vector judge."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,39}$",
        description="The criterion's name, as the judge writes it ('name: N') and as it is"
        " logged (reward/judge.<name>).",
    )
    weight: float = Field(
        1.0, ge=0, le=1000, description="Its weight in the reward (a weighted mean)."
    )


class JudgeParams(RewardParams):
    # the field naming a model: checked at submit time like model.name (backend.runs.inputs),
    # loaded at set-up as a causal LM (conspo.models.scoring.load_reward_models)
    model_names: ClassVar[tuple[str, ...]] = ("model",)
    model_use: ClassVar[Literal["generate"]] = "generate"

    model: Label = Field(
        min_length=1,
        max_length=300,
        description="The judge: a causal LM named as model.name is (a catalogue model, a"
        " model-store name such as a run's checkpoint, a local model directory or a hub id);"
        " loaded once, on the policy's device in its dtype, and prompted in its chat template.",
    )
    rubric: str = Field(
        DEFAULT_RUBRIC,
        min_length=1,
        max_length=20000,
        description="The judge's prompt: {question} is the task's own question, {answer} the"
        " rollout's completion, {max_score} the top score. It should ask for a final line"
        " 'Score: N' (the last such line of a judgement is its score).",
    )
    samples: int = Field(
        3, ge=1, le=32, description="Judgements sampled per rollout (k), then aggregated."
    )
    aggregate: Literal["mean", "median", "majority"] = Field(
        "mean",
        description="How a rollout's parsed scores combine: their mean, median, or the most"
        " common score (ties: the median of the tied scores).",
    )
    temperature: float = Field(
        0.7,
        ge=0,
        le=5,
        description="The judge's sampling temperature (0: greedy: one text, k times).",
    )
    max_new_tokens: int = Field(
        256,
        ge=4,
        le=8192,
        description="Tokens of one judgement at most (the critique and its score): a longer one"
        " is cut there, and with no score line before the cut it is dropped.",
    )
    max_prompt_tokens: int = Field(
        2048,
        ge=16,
        le=32768,
        description="Tokens of the judge's prompt at most: a longer one loses its start (the"
        " rubric's end, the answer and what to write stay).",
    )
    max_score: float = Field(
        10, gt=0, le=1000, description="The top score: the reward is the score / max_score."
    )
    seed: int = Field(
        0, ge=0, description="Where the judge's sampling starts: the same texts judge the same."
    )
    batch_size: int = Field(
        16, ge=1, le=1024, description="Judgements per call of the judge's sampler (about)."
    )
    dimensions: list[Dimension] = Field(
        default_factory=list,
        max_length=16,
        description="A vector judge's criteria ([{name, weight}]): the judge writes one 'name:"
        " N' line each instead of one score, each is logged as reward/judge.<name>, and the"
        " reward is their weighted mean / max_score. Empty: one 'Score: N'. With the default"
        " rubric, the rubric asks for the lines ({dimensions} in a rubric of yours lists them).",
    )
    timeout_s: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="Seconds one judging call may take (a step's batch of rollouts, per"
        " sampling round): past it the batch gets no reward from the judge, the reason is"
        " logged and the step goes on.",
    )

    @field_validator("rubric")
    @classmethod
    def _has_placeholders(cls, rubric: str) -> str:
        missing = [p for p in PLACEHOLDERS if p not in rubric]
        if missing:
            raise ValueError(f"the rubric must hold {' and '.join(missing)}")
        return rubric

    @model_validator(mode="after")
    def _dimensions_weigh_something(self) -> JudgeParams:
        names = [d.name.lower() for d in self.dimensions]
        if len(set(names)) < len(names):
            raise ValueError("dimensions: each name once (case does not tell names apart)")
        if self.dimensions and not any(d.weight > 0 for d in self.dimensions):
            raise ValueError("dimensions: at least one needs a weight above 0")
        return self

    @property
    def dimension_names(self) -> tuple[str, ...]:
        """What ``score_rollouts`` logs beside the reward (``Critiqued.dimensions``)."""
        return tuple(d.name for d in self.dimensions)

    def prompt(self, question: str, answer: str) -> str:
        """The judge's prompt for one rollout: the rubric (the vector one by default when
        there are dimensions) filled in."""
        rubric = self.rubric
        if self.dimensions and rubric == DEFAULT_RUBRIC:
            rubric = DEFAULT_VECTOR_RUBRIC
        lines = "\n".join(f"{d.name}: N" for d in self.dimensions)
        return judge_prompt(rubric, question, answer, self.max_score, lines)


@register_reward(
    "judge",
    params=JudgeParams,
    batched=True,
    description="A generative judge's score of each rollout (an LLM-as-judge proxy reward): a"
    " causal LM reads a rubric with the question and the answer, writes a critique and a final"
    " 'Score: N', k times; the reward is the aggregate score / max_score, in [0, 1]. The first"
    " critique is stored with the rollout. Costs k samplings of the judge per rollout; the"
    " verifier still decides who is positive.",
)
def judge_reward(
    completions: Sequence[str],
    examples: Sequence[Example],
    lengths: Sequence[int],
    context: RewardContext,
    params: BaseModel,
) -> list[Critiqued]:
    assert isinstance(params, JudgeParams)
    if context.models is None:
        raise RewardFailed("the judge reward calls a model: its context needs the models")
    prompts = [
        params.prompt(question(ex), text) for ex, text in zip(examples, completions, strict=True)
    ]
    try:
        judgements = context.models.generate(
            params.model,
            prompts,
            samples=params.samples,
            temperature=params.temperature,
            max_new_tokens=params.max_new_tokens,
            max_prompt_tokens=params.max_prompt_tokens,
            batch_size=params.batch_size,
            deadline=time.monotonic() + params.timeout_s,
            seed=params.seed,
        )
    except TimeoutError as exc:
        raise RewardFailed(
            f"judge {params.model!r} ran past timeout_s ({params.timeout_s:g} s): {exc}"
        ) from exc
    return [verdict(texts, params) for texts in judgements]


def judge_prompt(
    rubric: str, question: str, answer: str, max_score: float, dimensions: str = ""
) -> str:
    """``rubric`` with its placeholders filled in one pass (an answer that holds "{question}"
    stays as written)."""
    values = {
        "question": question,
        "answer": answer,
        "max_score": f"{max_score:g}",
        "dimensions": dimensions,
    }
    return re.sub(r"\{(question|answer|max_score|dimensions)\}", lambda m: values[m[1]], rubric)


def verdict(texts: Sequence[str], params: JudgeParams) -> Critiqued:
    """One rollout's value from its judgements: the aggregate of those that parse, over
    max_score (with dimensions: each dimension's, and their weighted mean); ``RewardFailed``
    quoting the first text when none does (for some dimension). Its critique is the first
    judgement's text."""
    first = texts[0] if texts else ""
    labels = params.dimension_names or ("Score",)
    scores: dict[str, float] = {}
    for label in labels:
        line = score_line(label)
        found = (parse_score(t, params.max_score, line) for t in texts)
        parsed = [s for s in found if s is not None]
        if not parsed:
            shown = first if len(first) <= QUOTED_CHARS else first[: QUOTED_CHARS - 1] + "…"
            which = f" for {label!r}" if params.dimensions else ""
            why = RewardFailed(
                f"judge {params.model!r} gave no score in range{which} in {len(texts)}"
                f" judgements (no '{label}: N' with 0 ≤ N ≤ {params.max_score:g}); the first:"
                f" {shown!r}"
            )
            return Critiqued(why, first)
        scores[label] = aggregate(parsed, params.aggregate) / params.max_score
    if not params.dimensions:
        return Critiqued(scores["Score"], first)
    total = sum(d.weight for d in params.dimensions)
    value = sum(d.weight * scores[d.name] for d in params.dimensions) / total
    return Critiqued(value, first, scores)


def parse_score(text: str, max_score: float, line: re.Pattern[str] = SCORE_LINE) -> float | None:
    """The judgement's score, on the 0..max_score scale: its LAST "Score: N" (``line``: or a
    dimension's "name: N"; case and spaces free, N a number), "N/D" read as N out of D; None
    when there is none or it is out of range (a score below 0 or above the top is no verdict
    on this scale)."""
    found = line.findall(text)
    if not found:
        return None
    number, out_of = found[-1]
    score = float(number)
    if out_of:
        if float(out_of) <= 0:
            return None
        score = score / float(out_of) * max_score
    return score if 0 <= score <= max_score else None


def aggregate(scores: Sequence[float], how: str) -> float:
    """The rollout's score from its parsed judgements: mean, median, or majority (the most
    common score; ties: the median of the tied scores)."""
    if how == "mean":
        return statistics.fmean(scores)
    if how == "median":
        return float(statistics.median(scores))
    if how == "majority":
        return float(statistics.median(statistics.multimode(scores)))
    raise ValueError(f"unknown aggregate {how!r}")
