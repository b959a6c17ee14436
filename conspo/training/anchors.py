"""The anchors of an objective that scores rollouts against them (RRPO,
``RegisteredObjective.anchors``; docs/objectives.md §10).

    anchors = Anchors()                                         # in setup
    features = rollout_features(model, ref_model, batch, cfg, precision)  # (N, H)
    anchors.collect(features, correct, group_ids, params)       # steps 1 … anchor_steps
    anchors.freeze(params, seed)                                # the head, trained once
    scores = anchors.scores(features)                           # (N,) from then on

A rollout's features are the frozen reference model's final hidden states, averaged over the
model's own tokens (the state each was chosen in): the reference never moves, so a head trained
once on the first steps' rollouts still reads later rollouts in the space it was trained in.
With LoRA the reference is the base model (the policy's adapters disabled), else the run's frozen
copy. The anchors and the head are saved in each checkpoint (``anchors/anchors.pt``) and resumed
with it, so a run resumed mid-collection keeps the anchors it had.

Shapes: N rollouts of the step, M anchors, H the reference's hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from conspo import metrics as M
from conspo import stopping
from conspo.distributed import collectives as distributed
from conspo.objectives.base import positive_mask
from conspo.objectives.rrpo import (
    ProjectionHead,
    RRPOParams,
    anchor_agreement,
    anchor_scores,
    train_projection,
)
from conspo.training.logprobs import token_states
from conspo.training.microbatch import micro_batches, piece_group_size, trimmed

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from conspo.config import RunConfig
    from conspo.generation.batch import RolloutBatch
    from conspo.models.precision import Precision

ANCHORS_DIR = "anchors"
ANCHORS_STATE = "anchors.pt"


@dataclass
class Anchors:
    """The anchor sets (features and labels, on the CPU) and, once frozen, the head."""

    features: list[torch.Tensor] = field(default_factory=list)  # (m_i, H) float32 per step
    positive: list[torch.Tensor] = field(default_factory=list)  # (m_i,) bool per step
    head: ProjectionHead | None = None
    head_losses: list[float] = field(default_factory=list)  # before / after its training

    @property
    def frozen(self) -> bool:
        return self.head is not None

    def counts(self) -> tuple[int, int]:
        """(positive anchors, negative anchors) collected so far."""
        labels = torch.cat(self.positive) if self.positive else torch.zeros(0, dtype=torch.bool)
        n_pos = int(labels.sum())
        return n_pos, len(labels) - n_pos

    def collect(
        self,
        features: torch.Tensor,
        correct: torch.Tensor,
        group_ids: torch.Tensor,
        params: RRPOParams,
    ) -> None:
        """Add the step's stratified anchors: from each group the first
        ``params.anchors_per_stratum`` positives and as many negatives (by the verified outcome
        ``correct``), while fewer than ``params.max_anchors`` are held. features: (N, H);
        correct, group_ids: (N,)."""
        positive = positive_mask(correct.cpu())
        groups = group_ids.cpu()
        keep = torch.zeros_like(positive)
        for group in torch.unique(groups).tolist():
            for label in (True, False):
                rows = ((groups == group) & (positive == label)).nonzero().flatten()
                keep[rows[: params.anchors_per_stratum]] = True
        room = params.max_anchors - sum(len(p) for p in self.positive)
        keep[keep.nonzero().flatten()[max(room, 0) :]] = False
        self.features.append(features.detach().float().cpu()[keep])
        self.positive.append(positive[keep])

    def ready(self, params: RRPOParams, step: int) -> bool:
        """Whether the head is trained at the end of ``step``: anchor_steps are past and both
        sets hold min_anchors."""
        n_pos, n_neg = self.counts()
        return step >= params.anchor_steps and min(n_pos, n_neg) >= params.min_anchors

    def freeze(self, params: RRPOParams, seed: int) -> None:
        """Train the projection head on every anchor collected and freeze it."""
        head, losses = train_projection(
            torch.cat(self.features), torch.cat(self.positive), params, seed, stopping.check
        )
        self.head, self.head_losses = head, losses

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """(N,) each rollout's score against the anchors (the head must be frozen)."""
        assert self.head is not None
        return anchor_scores(self.head, features.float().cpu())

    def stats(self, scores: torch.Tensor | None, correct: torch.Tensor) -> dict[str, torch.Tensor]:
        """rrpo/anchors (the anchors the frozen head was trained on, 0 before) and, given the
        step's (N,) anchor ``scores``, their agreement with its (N,) verified outcome ``correct``
        over the whole rollout batch (rrpo/anchor_auc, rrpo/anchor_gap): computed once here,
        not per mini-batch, so a mini-batch with one class only cannot make the step's NaN."""
        size = sum(len(p) for p in self.positive) if self.frozen else 0
        stats = {M.RRPO_ANCHORS: torch.tensor(float(size))}
        if scores is not None:
            auc, gap = anchor_agreement(scores, correct.to(scores.device))
            stats[M.RRPO_ANCHOR_AUC], stats[M.RRPO_ANCHOR_GAP] = auc, gap
        return stats


def load_anchors() -> Anchors:
    """The anchors of a run (empty: collected from its first steps)."""
    if distributed.active():
        raise ValueError(
            "algorithm 'rrpo' collects its anchors in one process for now: set"
            " resources.processes to 1"
        )
    return Anchors()


def rollout_features(
    model: PreTrainedModel,
    ref_model: PreTrainedModel | None,
    batch: RolloutBatch,
    cfg: RunConfig,
    precision: Precision,
) -> torch.Tensor:
    """(N, H) float32 on the CPU: each rollout's mean final hidden state of the reference model
    (``ref_model``, else ``model`` with its LoRA adapters disabled) over its model tokens (no
    grad, one micro-batch at a time)."""
    g = cfg.sampling.group_size
    n = batch.response_ids.shape[0]
    out: torch.Tensor | None = None
    mask = batch.model_mask.float()

    def states_of(piece: RolloutBatch, size: int) -> torch.Tensor:
        if ref_model is not None:
            return token_states(ref_model, piece, size)
        with model.disable_adapter():  # type: ignore[operator]  # a peft model
            return token_states(model, piece, size)

    with torch.no_grad(), precision.autocast():
        for idx in micro_batches(batch, g, cfg.optim.micro_batch_tokens):
            stopping.check()
            rows = idx.to(batch.response_ids.device)
            piece = trimmed(batch.select(rows))
            hidden = states_of(piece, piece_group_size(idx, g)).float()  # (k, t, H)
            weights = mask[rows, : hidden.shape[1]].to(hidden.device)
            summed = (hidden * weights[..., None]).sum(1)
            pooled = summed / weights.sum(1, keepdim=True).clamp_min(1)
            if out is None:
                out = torch.zeros(n, hidden.shape[-1])
            out[idx.cpu()] = pooled.cpu()
    assert out is not None
    return out


def save_anchors(anchors: Anchors, directory: Path) -> None:
    """Write the anchors into a checkpoint being written (``directory``: its temp dir)."""
    target = directory / ANCHORS_DIR
    target.mkdir()
    head = anchors.head
    state: dict[str, Any] = {
        "features": anchors.features,
        "positive": anchors.positive,
        "head": None
        if head is None
        else {"mean": head.mean, "std": head.std, "weight": head.weight, "centre": head.centre},
        "head_losses": torch.tensor(anchors.head_losses),
    }
    torch.save(state, target / ANCHORS_STATE)


def load_anchors_state(anchors: Anchors, checkpoint: Path) -> None:
    """Resume the anchors from ``checkpoint``; one without them (written by a run of another
    objective) is refused, not silently started afresh."""
    file = checkpoint / ANCHORS_DIR / ANCHORS_STATE
    if not file.exists():
        raise RuntimeError(
            f"checkpoint {checkpoint} holds no anchors ({ANCHORS_DIR}/{ANCHORS_STATE})"
        )
    saved = torch.load(file, map_location="cpu", weights_only=True)
    anchors.features = list(saved["features"])
    anchors.positive = list(saved["positive"])
    head = saved["head"]
    anchors.head = None if head is None else ProjectionHead(**head)
    anchors.head_losses = [float(x) for x in saved["head_losses"]]
