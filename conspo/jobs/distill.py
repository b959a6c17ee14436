"""The ``distill`` job kind: on-policy distillation, per-token reverse KL to a teacher.

    kind: distill
    kind_params: {teacher: tiny-arith}

Each step the student samples ``sampling.group_size`` responses to each of
``sampling.prompts_per_step`` training prompts at ``sampling.temperature`` (the trainer's own
sampler and engine); the teacher (a model-store name, a local directory or a hub id, loaded on
the student's device, frozen) scores the same tokens, and the loss is the reverse KL of the
student from the teacher at every response position, over the whole vocabulary:

    L = mean over response tokens t of  Σ_v π_θ(v | q, o_<t) · (log π_θ(v | ·) − log π_T(v | ·))

exact at each visited prefix (the prefixes are the student's own: on-policy), differentiable in
π_θ directly, so no policy-gradient estimator is needed for the per-token term. Teacher and
student must share a tokenizer (the vocabularies are compared at start).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from conspo import metrics as M
from conspo.input_checks import Label
from conspo.lazy import lazy_import
from conspo.registry import register_job_kind
from conspo.tasks.base import distinct_prompts

if TYPE_CHECKING:
    import torch

    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.training.loop import TrainResult, TrainState
else:
    torch = lazy_import("torch")


class DistillParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # the fields naming a model: checked at submit time like model.name (backend.runs.inputs),
    # and again by the model store when loaded
    model_names: ClassVar[tuple[str, ...]] = ("teacher",)

    teacher: Label = Field(
        "tiny-arith",
        min_length=1,
        max_length=300,
        description="The teacher: a model-store name, a local model directory or a hub id (as"
        " model.name), loaded on the student's device in its dtype; same tokenizer.",
    )


@register_job_kind(
    "distill",
    params=DistillParams,
    description="On-policy distillation: the student samples, the teacher scores every token,"
    " per-token reverse KL as the loss.",
    metrics=(
        M.LOSS,
        M.GRAD_NORM,
        M.DISTILL_REVERSE_KL,
        M.DISTILL_TEACHER_LOGPROB,
        M.DISTILL_LENGTH,
    ),
    sections=("sampling",),
    example_params={"teacher": "tiny"},  # the smallest built-in model, built locally in seconds
)
def train_distill(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    return run_loop(config, *args, start=one_update_per_step(start), **kwargs)


def start(state: TrainState, files: DataFiles, store: ModelStore) -> Any:
    from conspo.models.loading import load_pretrained
    from conspo.training.logprobs import logprob_mode
    from conspo.training.loop import optimiser_step, step_seed
    from conspo.training.rollouts import draw_rollouts

    cfg = state.cfg
    params = cfg.typed("kind_params", DistillParams)
    teacher, teacher_tok = load_pretrained(
        store.resolve(params.teacher), state.device, state.precision.weights
    )
    if teacher_tok.get_vocab() != state.tokenizer.get_vocab():
        raise ValueError(
            f"kind_params.teacher {params.teacher!r} has another tokenizer than the student"
            f" {cfg.model.name!r}; distillation compares their distributions token by token"
        )
    teacher.eval().requires_grad_(False)
    temperature = cfg.sampling.temperature

    def step(step: int) -> dict[str, float]:
        rng = random.Random(step_seed(cfg.seed, step, "p0"))
        prompts = distinct_prompts(state.task, rng, cfg.sampling.prompts_per_step)
        # the prefill unshared, as this kind has always sampled (shared: the same tokens to
        # float rounding, and faster)
        seed = step_seed(cfg.seed, step, "s0")
        batch, _, _ = draw_rollouts(state, prompts, seed, share_prefill=False)
        logprob_mode(state.model)
        seq = torch.cat([batch.prompt_ids, batch.response_ids], 1)
        attn = torch.cat([batch.prompt_mask, batch.response_mask.long()], 1)
        # left-padded prompts: positions count real tokens, as when the response was sampled
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        p, t = batch.prompt_ids.shape[1], batch.response_ids.shape[1]
        inputs = {"input_ids": seq, "attention_mask": attn, "position_ids": pos}
        # logits at positions p-1 .. p+t-2 predict the response tokens
        student = state.model(**inputs).logits[:, p - 1 : p + t - 1]
        with torch.no_grad():
            teach = teacher(**inputs).logits[:, p - 1 : p + t - 1]
        log_s = torch.log_softmax(student.float() / temperature, -1)
        log_t = torch.log_softmax(teach.float() / temperature, -1)
        kl = (log_s.exp() * (log_s - log_t)).sum(-1)  # (N, T) reverse KL per position
        resp = batch.model_mask  # the interpreter's tokens, with tools, are not the student's
        loss = (kl * resp).sum() / resp.sum()
        teacher_lp = log_t.gather(-1, batch.response_ids[..., None])[..., 0]
        grad_norm = optimiser_step(state, loss)
        engine_sync(state)
        return {
            M.LOSS: loss.item(),
            M.GRAD_NORM: grad_norm,
            M.DISTILL_REVERSE_KL: loss.item(),
            M.DISTILL_TEACHER_LOGPROB: float((teacher_lp * resp).sum() / resp.sum()),
            M.DISTILL_LENGTH: float(batch.model_lengths.float().mean()),
        }

    return step


def engine_sync(state: TrainState) -> None:
    """An engine with its own copy of the weights (vLLM) gets the updated ones."""
    state.engine.sync(state.model)
