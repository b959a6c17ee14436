"""ConSPO (or any registered objective) inside TRL's ``GRPOTrainer``, on TRL's engines.

    from conspo.integrations.trl import ConSPOTrainer      # instead of trl's GRPOTrainer
    trainer = ConSPOTrainer(
        model=model, reward_funcs=[verify], args=GRPOConfig(per_device_train_batch_size=16,
        num_generations=8, logging_steps=1, ...), train_dataset=dataset,
        algorithm="conspo", params={"tau": 10.0},          # any name of conspo.registry
    )
    trainer.train()

TRL still generates (transformers or vLLM), scores with the reward functions, shards over
processes (accelerate, DeepSpeed, FSDP) and steps the optimiser. What changes is the loss: each
micro-batch becomes a ``conspo.objectives.PolicyBatch`` (TRL's per-token log-probs with grad,
its old and reference log-probs when it computed them, the completion mask, the rewards, the
verified outcome and the group ids) and the registered objective's loss is backpropagated
(divided by the gradient-accumulation steps, as TRL's own losses are). TRL's ``loss_type``,
``scale_rewards``, ``epsilon`` and advantages are not used: the objective's ``params`` decide.
``params["beta"]`` is TRL's ``args.beta`` (the reference model is TRL's); giving both
different values is an error.

Whole groups. ConSPO's loss (and the group-normalised advantages of every objective here) is a
function of a whole group of G rollouts, but TRL shuffles the generation batch row by row and
splits it into ``steps_per_generation`` micro-batches. So:

- ``per_device_train_batch_size`` must be a multiple of ``num_generations`` (refused otherwise):
  each process's local generation batch is then a contiguous run of whole groups (TRL's
  ``RepeatSampler`` repeats each prompt G times in a row and every process takes a contiguous
  slice of the global batch), and so is each micro-batch;
- ``_prepare_inputs`` shuffles *groups* (``shuffle_groups``: a permutation of the groups, rows
  of a group kept together and in order) where TRL shuffles rows, then splits as TRL does.

Batch normalisers. What an objective normalises over the whole rollout batch (REINFORCE++'s
whitening, ``PolicyBatch.whole``; ``scale_rewards="batch"``'s std, ``batch_reward_std``) spans the
whole generation batch of every process, as in ``conspo.training.trainer``: its rewards are TRL's
(gathered over processes), its group ids global, its lengths gathered the same way, captured once
per generation batch and handed to each of its micro-batches (``WHOLE``), not recomputed per
micro-batch and process.

Positives (who is correct) are the verified outcome, never a shaped reward: with
``verifier=None`` the weighted sum of the reward functions must be binary (0/1, checked on
every batch: a clear error otherwise); with ``verifier="name"`` that reward function's raw value
(0/1) is the outcome and the weighted sum the reward the advantages see (e.g. a 0/1 correctness
function plus a format bonus). Rollouts no reward function could score count as reward 0, wrong.

Statistics. The §4 separation statistics (``conspo.training.stats.separation_stats``) of a
generation batch are computed once, on the whole batch of every process: each micro-batch of the
first pass over it keeps its rollouts' scores s_θ (the log-probs of the policy that sampled, the
ones the loss uses), clipped-ratio scores, outcomes, group ids and lengths; after the last one they
are gathered across processes (``accelerator.gather``) and reduced, with τ, m_t and ε of the
objective's ``params.separation_view``. They go into TRL's ``self._metrics`` under the
catalogue keys of ``conspo.metrics`` (so TRL's console and reporters get them as well), and a
bounded sample of per-rollout (score, reward, length) records goes to every callback that has an
``on_rollouts(args, state, control, step=, rollouts=)`` method (``conspo_lab.trl_bridge``'s
callback streams both into a ConSPO Lab run). Per micro-batch, the objective's own statistics
(clip fraction, KL, ...), the off-policy ratios (``conspo.training.stats.offpolicy_stats``) and the
entropy are combined over processes; TRL averages them over the logging window.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

try:
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import (
        split_pixel_values_by_grid,
        split_tensor_dict,
        unsplit_pixel_values_by_grid,
    )
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError("conspo.integrations.trl needs TRL: pip install 'conspo-lab[trl]'") from exc

from conspo import metrics as M
from conspo.objectives.base import (
    ObjectiveOutput,
    ObjectiveParams,
    PolicyBatch,
    SeparationView,
    WholeBatch,
    clipped_ratio_scores,
    sequence_scores,
)
from conspo.registry import get_objective
from conspo.sink import RolloutRecord
from conspo.training.stats import offpolicy_stats, separation_stats

__all__ = ["ConSPOTrainer", "shuffle_groups"]

# How per-process values of one micro-batch combine (the mean, except the ratio's extremes).
_COMBINE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    M.OFFPOLICY_RATIO_MAX: torch.amax,
    M.OFFPOLICY_RATIO_MIN: torch.amin,
}
# Extra columns the trainer adds to TRL's generation batch (one value per rollout).
REWARDS, OUTCOME, GROUP_IDS, REWARD_STD = (
    "conspo_rewards",
    "conspo_outcome",
    "conspo_group_ids",
    "conspo_reward_std",
)
# The whole generation batch of every process (a ``WholeBatch``, not a column: every micro-batch
# of the generation batch gets the same one, attached after TRL's split).
WHOLE = "conspo_whole"


def shuffle_groups(batch: Mapping[str, Any], group_size: int) -> dict[str, Any]:
    """``batch`` with its groups in random order, each group's ``group_size`` rows kept together.

    Rows are grouped contiguously (TRL's sampler repeats each prompt G times in a row). Like
    TRL's ``shuffle_sequence_dict``: tensors and lists are permuted along their first dimension,
    0-d tensors and None are kept.
    """
    n = len(next(v for v in batch.values() if v is not None and not _is_scalar(v)))
    if n % group_size:
        raise ValueError(f"{n} rows are not whole groups of {group_size}")
    groups = torch.randperm(n // group_size)
    order = (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)

    def permute(v: Any) -> Any:
        if v is None or _is_scalar(v):
            return v
        if isinstance(v, torch.Tensor):
            return v[order.to(v.device)]
        return [v[i] for i in order.tolist()]

    return {key: permute(value) for key, value in batch.items()}


def _is_scalar(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.ndim == 0


class ConSPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose loss is the registered objective ``algorithm`` (module docstring).

    algorithm:      a name of ``conspo.registry`` (conspo, grpo, dapo, dr_grpo, the baselines).
    params:         that objective's parameters (its pydantic model validates them).
    verifier:       name of the reward function whose 0/1 value is the verified outcome; None:
                    the (weighted) reward sum is the outcome and must be 0/1.
    rollout_sample: per-rollout records handed to ``on_rollouts`` callbacks per generation batch.
    Every other argument is ``GRPOTrainer``'s.
    """

    # What GRPOTrainer sets, with the types it guarantees after its __init__.
    args: GRPOConfig
    model: Any
    num_generations: int
    num_generations_eval: int
    max_completion_length: int
    _buffered_inputs: Any  # TRL declares it None; it holds the micro-batches

    @property
    def _per_generation(self) -> int:
        """Micro-batches per generation batch (GRPOConfig resolves None in __post_init__)."""
        return int(cast(int, self.args.steps_per_generation))

    def __init__(
        self,
        *args: Any,
        algorithm: str = "conspo",
        params: Mapping[str, Any] | None = None,
        verifier: str | None = None,
        rollout_sample: int = 64,
        **kwargs: Any,
    ) -> None:
        try:
            entry = get_objective(algorithm)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
        super().__init__(*args, **kwargs)
        self.algorithm = algorithm
        self.objective_fn: Callable[..., ObjectiveOutput] = entry.fn
        self.objective_params = cast(
            ObjectiveParams, entry.params.model_validate(self._with_trl_beta(dict(params or {})))
        )
        if verifier is not None and verifier not in self.reward_func_names:
            raise ValueError(
                f"verifier {verifier!r} is not a reward function of this trainer;"
                f" valid: {', '.join(self.reward_func_names)}"
            )
        self.verifier = verifier
        self.rollout_sample = rollout_sample
        self._check_whole_groups()
        self._unsupported_trl_options()
        self._pending_rollouts: list[dict[str, torch.Tensor]] = []
        self._last_rewards_per_func: torch.Tensor | None = None

    # --- configuration checks -----------------------------------------------------------------

    def _with_trl_beta(self, params: dict[str, Any]) -> dict[str, Any]:
        """The objective's β is TRL's: TRL loads the reference model and computes its log-probs
        only when ``args.beta`` > 0."""
        trl_beta = float(self.args.beta)
        if float(params.get("kl_in_reward", 0) or 0) > 0:
            # TRL forms the advantages from its rewards before the loss sees anything
            raise ValueError(
                "params.kl_in_reward: ConSPOTrainer cannot put a KL penalty in TRL's rewards"
                " (TRL computes the advantages); use GRPOConfig.beta for a KL in the loss"
            )
        if "beta" in params and float(params["beta"]) != trl_beta:
            raise ValueError(
                f"params.beta ({params['beta']}) differs from GRPOConfig.beta ({trl_beta}):"
                " set GRPOConfig.beta, which also loads the reference model"
            )
        return {**params, "beta": trl_beta}

    def _check_whole_groups(self) -> None:
        g, per_device = self.num_generations, self.args.per_device_train_batch_size
        if per_device % g:
            raise ValueError(
                f"ConSPOTrainer keeps every group whole in each micro-batch:"
                f" per_device_train_batch_size ({per_device}) must be a multiple of"
                f" num_generations ({g})"
            )

    def _unsupported_trl_options(self) -> None:
        """Refuse the TRL options that reweight the loss outside the objective."""
        refused = {
            "top_entropy_quantile": self.top_entropy_quantile < 1.0,
            "off_policy_mask_threshold": self.off_policy_mask_threshold is not None,
            "entropy_coef": bool(getattr(self, "_entropy_bonus_enabled", False)),
            "vllm_importance_sampling_correction": bool(
                self.use_vllm and self.vllm_importance_sampling_correction
            ),
        }
        bad = [name for name, on in refused.items() if on]
        if bad:
            raise ValueError(
                f"ConSPOTrainer does not support {', '.join(bad)}: the registered objective"
                " computes the whole loss; turn them off in GRPOConfig"
            )

    # --- generation batch: rewards, outcome, group ids; whole-group shuffle -----------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # (N_global, n_funcs), gathered over processes by TRL; kept for the outcome below.
        rewards_per_func = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        self._last_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        per_func = self._last_rewards_per_func
        assert per_func is not None
        weights = self.reward_weights.to(per_func.device)
        rewards = torch.nan_to_num(per_func, nan=0.0) @ weights  # (N_global,)
        if self.verifier is None:
            outcome = rewards
        else:
            outcome = torch.nan_to_num(per_func[:, self.reward_func_names.index(self.verifier)])
        binary = (outcome == 0) | (outcome == 1)
        if not bool(binary.all()):
            what = "the reward sum" if self.verifier is None else f"reward {self.verifier!r}"
            raise ValueError(
                f"{what} is not 0/1 (values {sorted(set(outcome[~binary].tolist()))[:5]});"
                " ConSPO's positives are the verified outcome: pass verifier=<the name of a 0/1"
                " reward function>"
            )
        n_local = len(inputs)
        start = self.accelerator.process_index * n_local
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        rows = torch.arange(start, start + n_local, device=rewards.device)
        output[REWARDS] = rewards[rows]
        output[OUTCOME] = outcome[rows]
        output[GROUP_IDS] = torch.div(rows, g, rounding_mode="floor")  # global: whole groups
        output[REWARD_STD] = rewards.std(correction=0)  # scale_rewards="batch": the whole batch's
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        # REINFORCE++ whitens over every rollout of the step: every process's, gathered in the
        # order TRL gathered the rewards (process by process, each its contiguous slice).
        lengths = self.accelerator.gather(mask.sum(-1))  # (N_global,)
        every = torch.arange(len(rewards), device=rewards.device)
        output[WHOLE] = WholeBatch(rewards, torch.div(every, g, rounding_mode="floor"), lengths)
        return output

    def _prepare_inputs(self, generation_batch):
        """TRL's ``_prepare_inputs`` with whole groups shuffled instead of rows."""
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        per_generation = self._per_generation
        if (
            self._step % (per_generation * self.num_iterations) == 0
            or self._buffered_inputs is None
        ):
            batch = self._generate_and_score_completions(generation_batch)
            whole = batch.pop(WHOLE, None)  # not a column: TRL's split would slice it
            batch = shuffle_groups(split_pixel_values_by_grid(batch), self.num_generations)
            self._buffered_inputs = [
                unsplit_pixel_values_by_grid(cast(Any, b)) | {WHOLE: whole}
                for b in split_tensor_dict(batch, per_generation)
            ]
            self._pending_rollouts = []
        return self._buffered_inputs[self._step % per_generation]

    # --- the loss ---------------------------------------------------------------------------

    def policy_batch(
        self, inputs: Mapping[str, Any], logprobs: torch.Tensor, entropy: torch.Tensor | None
    ) -> PolicyBatch:
        """The objective's input for one TRL micro-batch; ``logprobs`` (B, T) with grad.

        Its batch-level normalisers are those of the whole generation batch of every process:
        ``batch_reward_std`` and ``whole`` (None when this micro-batch is all of it, as in
        ``conspo.training.update.policy_batch``: its rows are a subset of the whole's)."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        whole: WholeBatch | None = inputs.get(WHOLE)
        if whole is not None and len(whole.rewards) == len(mask):
            whole = None
        return PolicyBatch(
            logprobs=logprobs,
            mask=mask.to(logprobs.dtype),
            rewards=inputs[REWARDS],
            group_ids=inputs[GROUP_IDS],
            progress=self.state.global_step / max(self.state.max_steps, 1),
            max_response_len=self.max_completion_length,
            old_logprobs=inputs.get("old_per_token_logps"),
            ref_logprobs=inputs.get("ref_per_token_logps"),
            batch_reward_std=float(inputs[REWARD_STD]),
            whole=whole,
            correct=inputs[OUTCOME],
            entropy=entropy,
        )

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        logprobs, entropy, _ = self._get_per_token_logps_and_entropies(
            model,
            torch.cat([prompt_ids, completion_ids], dim=1),
            torch.cat([prompt_mask, completion_mask], dim=1),
            completion_ids.size(1),
            compute_entropy=True,
            **{k: inputs.get(k) for k in _FORWARD_KEYS},
        )
        batch = self.policy_batch(inputs, logprobs, entropy.detach())
        out = self.objective_fn(batch, self.objective_params)
        mode = "train" if self.model.training else "eval"
        self._log_micro_batch(mode, batch, out.stats)
        if mode == "train" and (self._step // self._per_generation) % self.num_iterations == 0:
            self._keep_for_statistics(batch, completion_ids)
        normaliser = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        return out.loss / normaliser

    # --- statistics -------------------------------------------------------------------------

    def _view(self) -> SeparationView:
        return self.objective_params.separation_view(
            self.state.global_step / max(self.state.max_steps, 1)
        )

    def _log_micro_batch(
        self, mode: str, batch: PolicyBatch, stats: Mapping[str, torch.Tensor]
    ) -> None:
        """The objective's stats (TRL logs the loss itself), the off-policy ratios and the
        entropy of one micro-batch, combined over processes; one host sync."""
        view = self._view()
        mask = batch.mask
        local = {k: v for k, v in stats.items() if k != M.LOSS}
        local |= offpolicy_stats(
            batch.logprobs,
            batch.old_logprobs,
            mask,
            clip_low=view.clip_low,
            clip_high=view.clip_eps,
        )
        if batch.entropy is not None:
            local[M.ENTROPY] = (batch.entropy * mask).sum() / mask.sum().clamp_min(1)
        keys = list(local)
        stacked = torch.stack([local[k].float() for k in keys])
        gathered = self.accelerator.gather(stacked[None]).view(-1, len(keys))  # (P, K)
        values = [_COMBINE.get(k, torch.nanmean)(gathered[:, i]) for i, k in enumerate(keys)]
        for key, value in zip(keys, torch.stack(values).cpu().tolist(), strict=True):
            self._metrics[mode][key].append(value)

    def _keep_for_statistics(self, batch: PolicyBatch, completion_ids: torch.Tensor) -> None:
        """Keep one micro-batch's per-rollout values; after the generation batch's last one,
        compute and hand on its statistics."""
        view = self._view()
        mask = batch.mask
        logprobs = batch.logprobs.detach()
        behaviour = logprobs if batch.old_logprobs is None else batch.old_logprobs  # π_old
        lengths = mask.sum(-1)
        ended = torch.isin(completion_ids, torch.tensor(self.eos_token_ids, device=mask.device))
        self._pending_rollouts.append(
            {
                "score": sequence_scores(behaviour, mask),
                "clipped": clipped_ratio_scores(
                    logprobs, batch.old_logprobs, mask, batch.outcome, view.clip_eps
                ),
                "outcome": batch.outcome.float(),
                "group": batch.group_ids.float(),
                "length": lengths.float(),
                "truncated": (~(ended & (mask > 0)).any(-1)).float(),
            }
        )
        if len(self._pending_rollouts) == self._per_generation:
            self._log_generation_batch(view)
            self._pending_rollouts = []

    def _log_generation_batch(self, view: SeparationView) -> None:
        """§4 statistics of the whole generation batch (every process) into ``_metrics``, and
        a sample of its rollouts to the ``on_rollouts`` callbacks."""
        local = {
            k: torch.cat([p[k] for p in self._pending_rollouts]) for k in self._pending_rollouts[0]
        }
        every = {k: self.accelerator.gather(v) for k, v in local.items()}  # (N_global,) each
        order = torch.sort(every["group"], stable=True).indices
        every = {k: v[order] for k, v in every.items()}  # rows by group, each group in order
        sep = separation_stats(
            every["score"],
            every["outcome"],
            every["group"].long(),
            every["length"],
            margin=view.margin,
            tau=view.tau,
            clipped_scores=every["clipped"],
        )
        n = len(every["score"])
        keep = min(self.rollout_sample, n)
        idx = torch.linspace(0, n - 1, keep).round().long() if keep else torch.zeros(0).long()
        sample = torch.stack([every[k][idx.to(every[k].device)] for k in _SAMPLE_COLUMNS], 1)
        values = torch.cat([torch.stack(list(sep.values())).float(), sample.reshape(-1)]).cpu()
        flat = values.tolist()  # the generation batch's one host sync
        for key, value in zip(sep, flat[: len(sep)], strict=False):
            self._metrics["train"][key].append(value if math.isfinite(value) else math.nan)
        first_group = int(every["group"][0]) if n else 0
        g = self.num_generations
        width = len(_SAMPLE_COLUMNS)
        rows = [flat[len(sep) + i * width : len(sep) + (i + 1) * width] for i in range(keep)]
        records = [
            RolloutRecord(
                group=int(group) - first_group,
                index=int(i) % g,
                reward=outcome,
                score=score,
                length=int(length),
                truncated=bool(truncated),
            )
            for i, (score, outcome, group, length, truncated) in zip(
                idx.tolist(), rows, strict=True
            )
        ]
        self._hand_rollouts(records)

    def _hand_rollouts(self, records: list[RolloutRecord]) -> None:
        step = self.state.global_step + 1  # the optimiser step these rollouts train
        for callback in self.callback_handler.callbacks:
            hook = getattr(callback, "on_rollouts", None)
            if hook is not None:
                hook(self.args, self.state, self.control, step=step, rollouts=records)


# Columns of a rollout record, in the order the sample is packed.
_SAMPLE_COLUMNS = ("score", "outcome", "group", "length", "truncated")
# Multimodal / tool inputs TRL's forward takes when present (None otherwise).
_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
