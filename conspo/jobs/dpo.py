"""The ``dpo`` job kind: direct preference optimisation on (prompt, chosen, rejected) pairs.

    kind: dpo
    kind_params: {path: data/prefs.jsonl}        # columns prompt (a question), chosen, rejected
    kind_params: {from_run: 12}                  # pairs built from run 12's sampled rollouts

The loss is DPO's (Rafailov et al., 2023, Eq. 7), with the starting policy as the reference:

    L = −log σ(β · [(log π_θ(c|q) − log π_ref(c|q)) − (log π_θ(r|q) − log π_ref(r|q))])

log-probs summed over the response's tokens (EOS included) that the model wrote: an
``<interpreter>`` block inside a response (a rollout of a run with tools, a tool-use trace) is
the tool's output, not the policy's, and is left out of both sums
(``conspo.training.sft.answer_tokens``). With LoRA the reference is the base with the adapters
disabled; otherwise a frozen copy of the starting weights.

The pairs, from a file or a finished run's rollouts, are ``conspo.jobs.preferences``'
(shared with the ``reward_model`` kind).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from conspo import metrics as M
from conspo.jobs.preferences import PreferenceParams, load_pairs, pairs_from_run
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


class DPOParams(PreferenceParams):
    # path / from_run / max_pairs_per_prompt: the pairs (conspo.jobs.preferences)
    beta: float = Field(
        0.1, gt=0, le=100, description="β: the strength of the KL to the reference."
    )
    batch_size: int = Field(8, ge=1, le=4096, description="Pairs per step.")


@register_job_kind(
    "dpo",
    params=DPOParams,
    description="Direct preference optimisation on (chosen, rejected) pairs: a dataset"
    " (kind_params.path, columns prompt, chosen, rejected; the prompt a question, rendered like"
    " every prompt), or a finished run's correct vs wrong rollouts.",
    metrics=(M.LOSS, M.GRAD_NORM, M.DPO_ACCURACY, M.DPO_MARGIN, M.DPO_CHOSEN, M.DPO_REJECTED),
    input_runs=("from_run",),
    inputs=pairs_from_run,
    # pairs from run 1's stored rollouts: whoever runs the example hands pairs_from_run a few
    # (prompt, completion, reward) of that run (the registry test: a correct and a wrong answer
    # to some of the task's prompts), so no dataset file is needed
    example_params={"from_run": 1},
)
def train_dpo(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    workdir = Path(kwargs["workdir"])
    return run_loop(
        config,
        *args,
        start=one_update_per_step(lambda s, f, m: start(s, f, m, workdir)),
        **kwargs,
    )


def reference_logprobs(state: TrainState) -> Callable[[Any, Any, Any], torch.Tensor]:
    """The starting policy's (B,) summed log-probs of ``answer_rows``' labelled tokens, no grad:
    with LoRA the base with the adapters disabled, otherwise a frozen copy of the weights taken
    now (the ``kto`` kind's reference too)."""
    import copy

    from conspo.training.logprobs import sequence_logprobs

    lora = state.cfg.model.lora.rank > 0
    ref = None if lora else copy.deepcopy(state.model).eval().requires_grad_(False)

    def reference(ids: Any, mask: Any, labels: Any) -> torch.Tensor:
        with torch.no_grad():
            if ref is not None:
                return sequence_logprobs(ref, ids, mask, labels)[0]
            with state.model.disable_adapter():  # type: ignore[operator]  # a peft model
                return sequence_logprobs(state.model, ids, mask, labels)[0]

    return reference


def start(state: TrainState, files: DataFiles, store: ModelStore, workdir: Path) -> Any:
    from conspo.tasks.prompts import PromptRenderer
    from conspo.training.logprobs import sequence_logprobs
    from conspo.training.loop import optimiser_step, step_seed
    from conspo.training.sft import answer_rows

    cfg = state.cfg
    params = cfg.typed("kind_params", DPOParams)
    pairs = load_pairs(params, files, workdir, PromptRenderer(cfg.prompt, state.tokenizer))
    reference = reference_logprobs(state)

    def step(step: int) -> dict[str, float]:
        rng = random.Random(step_seed(cfg.seed, step, "dpo"))
        drawn = [pairs[rng.randrange(len(pairs))] for _ in range(params.batch_size)]
        rows = [(p.prompt, p.chosen) for p in drawn] + [(p.prompt, p.rejected) for p in drawn]
        ids, mask, labels = answer_rows(state.tokenizer, rows, state.device, 0)
        state.model.eval()  # no dropout: π_θ and π_ref score the same way
        policy = sequence_logprobs(state.model, ids, mask, labels)[0]
        ratio = policy - reference(ids, mask, labels)  # (2B,) log π_θ/π_ref per response
        b = len(drawn)
        chosen, rejected = params.beta * ratio[:b], params.beta * ratio[b:]
        margin = chosen - rejected
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        grad_norm = optimiser_step(state, loss)
        return {
            M.LOSS: loss.item(),
            M.GRAD_NORM: grad_norm,
            M.DPO_ACCURACY: float((margin > 0).float().mean()),
            M.DPO_MARGIN: float(margin.detach().mean()),
            M.DPO_CHOSEN: float(chosen.detach().mean()),
            M.DPO_REJECTED: float(rejected.detach().mean()),
        }

    return step
