"""The ``reward_model`` job kind: a Bradley–Terry reward model trained on (prompt, chosen,
rejected) pairs.

    kind: reward_model
    kind_params: {path: data/prefs.jsonl}        # columns prompt (a question), chosen, rejected
    kind_params: {from_run: 12}                  # pairs built from run 12's sampled rollouts

The model is the catalogue model with a sequence-score head (``RegisteredJobKind.head``
"sequence_score": transformers' ``AutoModelForSequenceClassification`` with num_labels=1, one
scalar r(x, y) read at the last non-pad token: TRL RewardTrainer's format), trained whole or with
LoRA (the head trained beside the adapters). The loss is Bradley–Terry's,

    L = −log σ(r(x, y_w) − r(x, y_l)),   the mean over the step's batch_size pairs,

drawn from the training pairs by (seed, step). The model reads a pair's side as the scoring
reward reads a rollout (``conspo.models.scoring.conversation_ids``: the conversation [user:
prompt, assistant: answer] in the model's own chat template, at most ``max_tokens`` tokens), so a
checkpoint of this kind, exported, is what the ``reward_model`` reward loads and it scores there
as it did here. A pairs file's prompt is therefore the question as written, not this run's
rendering of it. Pairs from a run (``from_run``) hold the prompt that run's policy saw, rendered
in its template (the stored rollouts keep no other): a reward model trained on them reads, at
reward time, the bare question instead. A pairs file of bare questions avoids that shift
(bench/reward_model.py builds one from a task's own sampled answers).

A share of the prompts (``eval_fraction``, drawn from the seed) is held out, all their pairs
with them; at each of the loop's evaluation points the kind scores them instead of generating
answers to the task (the loop's ``held_out`` hook): pair accuracy and mean margin
r(chosen) − r(rejected), beside the same two on each step's training batch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from conspo import metrics as M
from conspo.jobs.preferences import Pair, PreferenceParams, load_pairs, pairs_from_run
from conspo.lazy import lazy_import
from conspo.registry import register_job_kind

if TYPE_CHECKING:
    import torch

    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.training.loop import TrainResult, TrainState
else:
    torch = lazy_import("torch")


class RewardModelParams(PreferenceParams):
    # path / from_run / max_pairs_per_prompt: the pairs (conspo.jobs.preferences)
    batch_size: int = Field(8, ge=1, le=4096, description="Pairs per step.")
    eval_fraction: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="Share of the prompts held out, with all their pairs, for the held-out"
        " pair accuracy and margin (at least one prompt when above 0; drawn from the seed)."
        " 0: no held-out split.",
    )
    max_tokens: int = Field(
        1024,
        ge=16,
        le=32768,
        description="Tokens of one scored text at most (the conversation, prompt and answer):"
        " longer ones lose the prompt's start first, as the reward_model reward cuts them.",
    )


@register_job_kind(
    "reward_model",
    params=RewardModelParams,
    description="A Bradley–Terry reward model: the model with a one-scalar head on its last"
    " token, trained so chosen answers score above rejected ones, on a dataset"
    " (kind_params.path, columns prompt, chosen, rejected) or a finished run's correct vs wrong"
    " rollouts; held-out pair accuracy at each evaluation. Its checkpoint is what the"
    " reward_model reward loads.",
    metrics=(
        M.LOSS,
        M.GRAD_NORM,
        M.RM_ACCURACY,
        M.RM_MARGIN,
        M.EVAL_RM_ACCURACY,
        M.EVAL_RM_MARGIN,
    ),
    input_runs=("from_run",),
    inputs=pairs_from_run,
    # pairs from run 1's stored rollouts (as dpo's example: the registry test hands
    # pairs_from_run a correct and a wrong answer to a few of the task's prompts)
    example_params={"from_run": 1},
    head="sequence_score",
)
def train_reward_model(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    workdir = Path(kwargs["workdir"])
    return run_loop(
        config,
        *args,
        start=one_update_per_step(lambda s, f, m: start(s, f, m, workdir)),
        **kwargs,
    )


def split_by_prompt(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(training, held-out) pairs: ``fraction`` of the distinct prompts (rounded, at least one
    when above 0) drawn by ``seed`` are held out with every pair of theirs, so no held-out
    prompt is trained on. Refused when nothing would be left to train on."""
    prompts = sorted({p.prompt for p in pairs})
    held_count = max(1, round(fraction * len(prompts))) if fraction > 0 else 0
    if held_count >= len(prompts):
        raise ValueError(
            f"kind_params.eval_fraction: holding out {held_count} of the {len(prompts)}"
            " prompts with pairs leaves none to train on; lower it (0: no held-out split)"
        )
    held = set(random.Random(seed).sample(prompts, held_count))
    return [p for p in pairs if p.prompt not in held], [p for p in pairs if p.prompt in held]


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """−log σ(r_w − r_l), the mean over the pairs."""
    return -torch.nn.functional.logsigmoid(chosen - rejected).mean()


def score_rows(
    model: Any, tokenizer: Any, prompts: list[str], answers: list[str], max_tokens: int
) -> torch.Tensor:
    """The model's (B,) float32 scores of (prompt, answer) rows, read as the ``reward_model``
    reward reads them (``conversation_ids``, right-padded, the head at the last non-pad
    token); with gradients when the caller computes them."""
    from conspo.models.scoring import conversation_ids

    rows = [
        conversation_ids(tokenizer, p, a, max_tokens) for p, a in zip(prompts, answers, strict=True)
    ]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), int(model.config.pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    out = model(
        input_ids=ids.to(model.device), attention_mask=mask.to(model.device), use_cache=False
    )
    return out.logits[:, 0].float()


def pair_scores(
    model: Any, tokenizer: Any, pairs: list[Pair], max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r(chosen), r(rejected)) of ``pairs``, both sides in one forward pass."""
    prompts = [p.prompt for p in pairs] * 2
    answers = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    scores = score_rows(model, tokenizer, prompts, answers, max_tokens)
    return scores[: len(pairs)], scores[len(pairs) :]


def start(state: TrainState, files: DataFiles, store: ModelStore, workdir: Path) -> Any:
    from conspo.training.loop import optimiser_step, step_seed

    cfg = state.cfg
    params = cfg.typed("kind_params", RewardModelParams)
    # The prompt as written: the model reads it as the reward does, in its own chat template.
    pairs = load_pairs(params, files, workdir, lambda prompt: prompt)
    split_seed = step_seed(cfg.seed, 0, "reward_model/split")
    train, held = split_by_prompt(pairs, params.eval_fraction, split_seed)

    def held_out(step: int) -> dict[str, float]:
        if not held:
            return {}
        margins = []
        with torch.no_grad():
            for i in range(0, len(held), params.batch_size):
                chosen, rejected = pair_scores(
                    state.model, state.tokenizer, held[i : i + params.batch_size], params.max_tokens
                )
                margins.append(chosen - rejected)
        margin = torch.cat(margins)
        return {
            M.EVAL_RM_ACCURACY: float((margin > 0).float().mean()),
            M.EVAL_RM_MARGIN: float(margin.mean()),
        }

    state.held_out = held_out

    def step(step: int) -> dict[str, float]:
        rng = random.Random(step_seed(cfg.seed, step, "reward_model"))
        drawn = [train[rng.randrange(len(train))] for _ in range(params.batch_size)]
        chosen, rejected = pair_scores(state.model, state.tokenizer, drawn, params.max_tokens)
        loss = bradley_terry_loss(chosen, rejected)
        grad_norm = optimiser_step(state, loss)
        margin = (chosen - rejected).detach()
        return {
            M.LOSS: loss.item(),
            M.GRAD_NORM: grad_norm,
            M.RM_ACCURACY: float((margin > 0).float().mean()),
            M.RM_MARGIN: float(margin.mean()),
        }

    return step
