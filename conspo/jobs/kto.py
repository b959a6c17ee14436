"""The ``kto`` job kind: Kahneman–Tversky optimisation on single completions labelled desirable or
undesirable (docs/objectives.md §8.2).

    kind: kto
    kind_params: {path: data/labels.jsonl}       # columns prompt (a question), completion, label
    kind_params: {path: data/prefs.jsonl}        # a DPO pairs file: chosen desirable, rejected not
    kind_params: {from_run: 12}                  # run 12's rollouts: correct desirable, wrong not

The loss is KTO's (Ethayarajh et al., 2024, "KTO: Model Alignment as Prospect Theoretic
Optimization", arXiv:2402.01306, Eq. 7 as TRL's KTOTrainer cites it), with the starting policy as
the reference:

    r_θ(x, y) = log π_θ(y|x) − log π_ref(y|x)
    z_0       = max(0, mean_i r_θ(x_i, y_{i−1}))                detached
    v(x, y)   = λ_D·σ(β(r_θ(x, y) − z_0))   if y is desirable
                λ_U·σ(β(z_0 − r_θ(x, y)))   if y is undesirable
    L         = mean over the batch of (λ_y − v(x, y))

log-probs summed over the completion's tokens (EOS included) that the model wrote, an
``<interpreter>`` block left out as DPO leaves it out (``conspo.training.sft.answer_rows``). The
reference point z_0 is the paper's estimate of KL(π_θ ‖ π_ref): the batch's prompts each with
another example's completion (the batch's completions shifted by one, as TRL's KTOTrainer builds
its KL dataset), scored by both models without gradients; it only sets where "gain" and "loss"
start, and no gradient flows through it. With LoRA the reference is the base with the adapters
disabled; otherwise a frozen copy of the starting weights (``conspo.jobs.dpo.reference_logprobs``).

Each step draws ``batch_size`` examples uniformly with the step's seed, so a batch's sides are as
unbalanced as the data: that is KTO's setting. The paper advises λ_D·n_D / (λ_U·n_U) in [1, 4/3]
(n_D, n_U: desirable and undesirable examples); each step logs the batch's
(``kto/desirable_weight_ratio``), so a run can tell an imbalance to correct with the weights.

The examples, from a labels file, a pairs file or a finished run's rollouts, are
``conspo.jobs.preferences``' (``LabelledParams``, shared with the pair kinds' loading).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from conspo import metrics as M
from conspo.jobs.preferences import LabelledParams, labelled_from_run, load_labelled
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


class KTOParams(LabelledParams):
    # path / from_run / max_per_prompt: the examples (conspo.jobs.preferences.LabelledParams)
    beta: float = Field(
        0.1,
        gt=0,
        le=100,
        description="β: how sharply the value saturates in r_θ − z_0 (the strength of the"
        " pull towards the reference).",
    )
    desirable_weight: float = Field(
        1.0,
        gt=0,
        le=100,
        description="λ_D: the weight of a desirable completion. The paper advises λ_D·n_D /"
        " (λ_U·n_U) in [1, 4/3] (n: the examples of each side; logged per step).",
    )
    undesirable_weight: float = Field(
        1.0, gt=0, le=100, description="λ_U: the weight of an undesirable completion."
    )
    batch_size: int = Field(
        8,
        ge=2,
        le=4096,
        description="Completions per step (at least 2: the reference point pairs each prompt"
        " with another example's completion).",
    )


@register_job_kind(
    "kto",
    params=KTOParams,
    description="Kahneman–Tversky optimisation on single completions labelled desirable or not:"
    " a dataset (kind_params.path, columns prompt, completion, label; or a DPO pairs file whose"
    " each pair is a desirable and an undesirable completion; the prompt a question, rendered"
    " like every prompt), or a finished run's correct (desirable) and wrong rollouts. The sides"
    " need not balance.",
    metrics=(
        M.LOSS,
        M.GRAD_NORM,
        M.KTO_ACCURACY,
        M.KTO_REWARD_DESIRABLE,
        M.KTO_REWARD_UNDESIRABLE,
        M.KTO_KL,
        M.KTO_WEIGHT_RATIO,
    ),
    input_runs=("from_run",),
    inputs=labelled_from_run,
    # examples from run 1's stored rollouts: whoever runs the example hands labelled_from_run a
    # few (prompt, completion, reward) of that run (the registry test: a correct and a wrong
    # answer to some of the task's prompts), so no dataset file is needed
    example_params={"from_run": 1},
)
def train_kto(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    workdir = Path(kwargs["workdir"])
    return run_loop(
        config,
        *args,
        start=one_update_per_step(lambda s, f, m: start(s, f, m, workdir)),
        **kwargs,
    )


def kto_loss(
    ratio: torch.Tensor,
    mismatched_ratio: torch.Tensor,
    desirable: torch.Tensor,
    beta: float,
    desirable_weight: float,
    undesirable_weight: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, z_0): KTO's loss, the mean over the batch of λ_y − v(x, y), and its reference point.

    ``ratio`` (B,): r_θ = log π_θ(y|x) − log π_ref(y|x) of each example, with gradients;
    ``mismatched_ratio`` (M,): r_θ of mismatched (prompt, completion) pairs, whose mean, floored
    at 0 and detached, is z_0 (a 0-d tensor); ``desirable`` (B,) bool.
    """
    z0 = mismatched_ratio.detach().mean().clamp(min=0)
    value = torch.where(
        desirable,
        desirable_weight * torch.sigmoid(beta * (ratio - z0)),
        undesirable_weight * torch.sigmoid(beta * (z0 - ratio)),
    )
    weight = torch.where(desirable, desirable_weight, undesirable_weight)
    return (weight - value).mean(), z0


def batch_stats(
    loss: torch.Tensor,
    ratio: torch.Tensor,
    z0: torch.Tensor,
    desirable: torch.Tensor,
    params: KTOParams,
) -> dict[str, float]:
    """The step's loss and KTO metrics, read to the host at once: side accuracy against z_0,
    each side's mean β·r_θ (NaN for a side the batch lacks), z_0 and the batch's λ_D·n_D /
    (λ_U·n_U) (inf without an undesirable example). ``ratio``, ``desirable``: (B,)."""
    ratio = ratio.detach()
    undesirable = ~desirable
    n_d, n_u = desirable.sum(), undesirable.sum()
    right = torch.where(desirable, ratio > z0, ratio < z0).float().mean()
    reward = params.beta * ratio
    stats = torch.stack([
        loss.detach(),
        right,
        (reward * desirable).sum() / n_d,  # 0/0 = NaN: no desirable example drawn
        (reward * undesirable).sum() / n_u,
        z0,
        n_d.float(),
        n_u.float(),
    ]).tolist()  # fmt: skip
    loss_value, accuracy, desirable_reward, undesirable_reward, kl, drawn_d, drawn_u = stats
    d_weight, u_weight = params.desirable_weight * drawn_d, params.undesirable_weight * drawn_u
    return {
        M.LOSS: loss_value,
        M.KTO_ACCURACY: accuracy,
        M.KTO_REWARD_DESIRABLE: desirable_reward,
        M.KTO_REWARD_UNDESIRABLE: undesirable_reward,
        M.KTO_KL: kl,
        M.KTO_WEIGHT_RATIO: d_weight / u_weight if u_weight else math.inf,
    }


def start(state: TrainState, files: DataFiles, store: ModelStore, workdir: Path) -> Any:
    from conspo.jobs.dpo import reference_logprobs
    from conspo.tasks.prompts import PromptRenderer
    from conspo.training.logprobs import sequence_logprobs
    from conspo.training.loop import optimiser_step, step_seed
    from conspo.training.sft import answer_rows

    cfg = state.cfg
    params = cfg.typed("kind_params", KTOParams)
    examples = load_labelled(params, files, workdir, PromptRenderer(cfg.prompt, state.tokenizer))
    reference = reference_logprobs(state)

    def log_ratio(rows: list[tuple[str, str]]) -> torch.Tensor:
        """(B,) log π_θ/π_ref of (prompt, completion) rows, with gradients where enabled."""
        ids, mask, labels = answer_rows(state.tokenizer, rows, state.device, 0)
        policy = sequence_logprobs(state.model, ids, mask, labels)[0]
        return policy - reference(ids, mask, labels)

    def step(step: int) -> dict[str, float]:
        rng = random.Random(step_seed(cfg.seed, step, "kto"))
        drawn = [examples[rng.randrange(len(examples))] for _ in range(params.batch_size)]
        # each prompt with the previous example's completion (the first with the last's)
        mismatched = [(e.prompt, drawn[i - 1].completion) for i, e in enumerate(drawn)]
        state.model.eval()  # no dropout: π_θ and π_ref score the same way
        with torch.no_grad():
            mismatched_ratio = log_ratio(mismatched)  # (B,) no graph: z_0 is detached
        ratio = log_ratio([(e.prompt, e.completion) for e in drawn])  # (B,)
        desirable = torch.tensor([e.desirable for e in drawn], device=ratio.device)
        loss, z0 = kto_loss(
            ratio,
            mismatched_ratio,
            desirable,
            params.beta,
            params.desirable_weight,
            params.undesirable_weight,
        )
        grad_norm = optimiser_step(state, loss)
        return {M.GRAD_NORM: grad_norm, **batch_stats(loss, ratio, z0, desirable, params)}

    return step
