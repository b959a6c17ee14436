"""The ``rejection_sampling`` job kind: rejection-sampling fine-tuning (STaR, RFT, ReST-EM).

    kind: rejection_sampling
    kind_params: {round_steps: 4, max_per_prompt: 2, batch_size: 16}
    sampling: {prompts_per_step: 64, group_size: 8, max_new_tokens: 128}   # a round's draw

Each round (every ``round_steps`` steps, from step 1) samples ``sampling.group_size`` answers to
each of ``sampling.prompts_per_step`` training prompts from the current model, at the run's
sampling settings, exactly as an RL step samples and rewards them (``sample_groups``: tools,
environments and every listed reward included). It keeps the answers the ``accept`` reward
passes (above ``threshold``: the verifier by default, so the verified-correct ones; or a reward
model or judge listed in ``rewards``), drops exact duplicates (per prompt, whitespace-trimmed),
keeps at most ``max_per_prompt`` per prompt, and adds them to the pool: with ``pool:
all_rounds`` every round's kept answers (RFT accumulates its data), with ``this_round`` only the
latest (STaR's iterations). The round's ``round_steps`` steps are then SFT steps on batches
drawn from the pool, the loss on the answer's tokens (``conspo.training.sft``). Each round
samples from the model as the previous round left it (ReST-EM's continued policy), so
``steps / round_steps`` rounds grow the data with the model. The held-out evaluation at
``eval.every = round_steps`` gives the accuracy per round.

A round's kept answers are written to ``workdir/rejection_sampling/round_NNN.jsonl`` before its
first update: a resumed run reads them back instead of sampling again, so a crash mid-round
neither loses nor redraws them. A round whose pool is empty (no answer passed, in any round so
far) fails the run with what to change: there is nothing to fine-tune on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from conspo import metrics as M
from conspo.registry import Loc, register_job_kind

if TYPE_CHECKING:
    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.training.loop import TrainResult, TrainState

ROUNDS_DIR = "rejection_sampling"  # in the job's workdir: each round's kept answers


class RejectionSamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    round_steps: int = Field(
        4,
        ge=1,
        le=100_000,
        description="SFT steps per round: a round samples, filters, then trains this many steps"
        " on the pool (steps / round_steps rounds in all).",
    )
    accept: str = Field(
        "verifier",
        min_length=1,
        max_length=100,
        description="The reward that decides which sampled answers are kept (one of rewards):"
        " the verifier by default (the verified-correct answers), or a reward model / judge.",
    )
    threshold: float = Field(
        0.5,
        ge=-1e6,
        le=1e6,
        description="An answer is kept when its accept reward is above this (the verifier's"
        " outcome is 0 or 1: 0.5 keeps the correct ones).",
    )
    max_per_prompt: int = Field(
        4,
        ge=1,
        le=1000,
        description="Distinct kept answers per prompt and round, at most (the rest dropped, so"
        " easy prompts do not crowd out the hard ones).",
    )
    pool: Literal["all_rounds", "this_round"] = Field(
        "all_rounds",
        description="What the SFT steps draw from: every round's kept answers so far (RFT), or"
        " the latest round's only (STaR's iterations).",
    )
    batch_size: int = Field(16, ge=1, le=4096, description="Answers per SFT step.")


def accept_problems(config: RunConfig) -> list[tuple[Loc, str, object]]:
    """The accept reward must be one the run scores (its rewards; the verifier always is)."""
    accept = config.typed("kind_params", RejectionSamplingParams).accept
    names = [r.name for r in config.rewards]
    if accept in names:
        return []
    message = f"accept {accept!r} is not one of the run's rewards ({', '.join(names)})"
    return [(("kind_params", "accept"), message, accept)]


@register_job_kind(
    "rejection_sampling",
    params=RejectionSamplingParams,
    description="Rejection-sampling fine-tuning (STaR / RFT): each round samples answers from"
    " the current model, keeps those the accept reward passes (the verifier by default),"
    " deduplicated and capped per prompt, and fine-tunes on them (SFT) for round_steps steps.",
    metrics=(
        M.LOSS,
        M.GRAD_NORM,
        M.SFT_TOKEN_ACC,
        M.SFT_TOKENS,
        M.RFT_ACCEPTED,
        M.RFT_KEPT,
        M.RFT_PROMPTS_KEPT,
        M.RFT_POOL,
    ),
    sections=("sampling", "rewards"),
    # two one-step rounds that keep every answer (the registry's tiny model solves no sum: a
    # threshold under the verifier's 0 lets its answers through, so the whole path runs)
    example_params={"round_steps": 1, "batch_size": 4, "threshold": -1},
    check=accept_problems,
)
def train_rejection_sampling(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    workdir = Path(kwargs["workdir"])
    return run_loop(
        config,
        *args,
        start=one_update_per_step(lambda s, f, m: start(s, f, m, workdir)),
        **kwargs,
    )


Kept = list[tuple[str, str]]  # (rendered prompt, answer) pairs


def keep(
    prompts: list[str], answers: list[str], values: list[float], params: RejectionSamplingParams
) -> Kept:
    """The answers to keep, in order: above the threshold, distinct per prompt (trimmed), at
    most ``max_per_prompt`` per prompt."""
    seen: dict[str, set[str]] = {}
    kept: Kept = []
    for prompt, answer, value in zip(prompts, answers, values, strict=True):
        distinct = seen.setdefault(prompt, set())
        trimmed = answer.strip()
        if value <= params.threshold or trimmed in distinct:
            continue
        if len(distinct) >= params.max_per_prompt:
            continue
        distinct.add(trimmed)
        kept.append((prompt, answer))
    return kept


def start(state: TrainState, files: DataFiles, store: ModelStore, workdir: Path) -> Any:
    from conspo.jobs.distill import engine_sync
    from conspo.tasks.base import distinct_prompts
    from conspo.training.loop import optimiser_step, step_seed
    from conspo.training.rollouts import sample_groups
    from conspo.training.sft import answer_loss, answer_rows

    cfg = state.cfg
    params = cfg.typed("kind_params", RejectionSamplingParams)
    rounds_dir = workdir / ROUNDS_DIR
    rounds: dict[int, Kept] = {}  # round → its kept answers, read or sampled once

    def round_file(r: int) -> Path:
        return rounds_dir / f"round_{r:03d}.jsonl"

    def sample_round(r: int) -> tuple[Kept, dict[str, float]]:
        """Round ``r``'s kept answers and what its draw measured."""
        first_step = r * params.round_steps + 1
        rng = random.Random(step_seed(cfg.seed, first_step, "rft-prompts"))
        prompts = distinct_prompts(state.task, rng, cfg.sampling.prompts_per_step)
        with state.precision.autocast():
            drawn = sample_groups(state, prompts, step_seed(cfg.seed, first_step, "rft"))
        # the whole response the model wrote (a tool's output inside it is out of the loss)
        answers = state.tokenizer.batch_decode(
            drawn.batch.response_ids.cpu().tolist(), skip_special_tokens=True
        )
        values = drawn.reward_parts[params.accept].tolist()
        rows = [ex.prompt for ex in prompts for _ in range(cfg.sampling.group_size)]
        kept = keep(rows, answers, values, params)
        rounds_dir.mkdir(parents=True, exist_ok=True)
        tmp = round_file(r).with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in kept))
        tmp.replace(round_file(r))  # whole or absent: a resumed run samples it again
        accepted = sum(v > params.threshold for v in values)
        return kept, {
            # each listed reward's mean over the round's draw, as an RL step logs its own
            **{M.reward_key(k): float(v.mean()) for k, v in drawn.reward_parts.items()},
            M.RFT_ACCEPTED: accepted / len(values),
            M.RFT_KEPT: float(len(kept)),
            M.RFT_PROMPTS_KEPT: len({p for p, _ in kept}) / len(prompts),
        }

    def round_answers(r: int) -> Kept:
        if r not in rounds:
            path = round_file(r)
            lines = path.read_text().splitlines() if path.is_file() else []
            rounds[r] = [(row["prompt"], row["answer"]) for row in map(json.loads, lines)]
        return rounds[r]

    def step(step: int) -> dict[str, float]:
        r = (step - 1) // params.round_steps
        drew: dict[str, float] = {}
        if not round_file(r).is_file():
            rounds[r], drew = sample_round(r)
        pool = [a for k in range(r + 1) for a in round_answers(k)]
        if params.pool == "this_round":
            pool = round_answers(r)
        if not pool:
            raise ValueError(
                f"rejection sampling, round {r + 1}: no sampled answer passed"
                f" kind_params.accept ({params.accept} > {params.threshold}), so there is"
                " nothing to fine-tune on: a task the model solves sometimes, more answers per"
                " prompt (sampling.group_size), more prompts (sampling.prompts_per_step) or a"
                " lower kind_params.threshold"
            )
        rng = random.Random(step_seed(cfg.seed, step, "rft-sft"))
        batch = [pool[rng.randrange(len(pool))] for _ in range(params.batch_size)]
        ids, mask, labels = answer_rows(state.tokenizer, batch, state.device, 0)
        loss, hit, n = answer_loss(state.model, ids, mask, labels)
        grad_norm = optimiser_step(state, loss)
        engine_sync(state)
        return {
            M.LOSS: loss.item(),
            M.GRAD_NORM: grad_norm,
            M.SFT_TOKEN_ACC: hit.item(),
            M.SFT_TOKENS: float(n),
            M.RFT_POOL: float(len(pool)),
            **drew,
        }

    return step
