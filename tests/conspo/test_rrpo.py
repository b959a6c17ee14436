"""RRPO (docs/objectives.md §10): the anchor scores, the head's contrastive loss, the advantages
and the loss against hand-computed cases; the head trained on anchors that a nuisance direction
hides; the trainer's stratified collection, freezing, and exact resume."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.objectives.base import PolicyBatch
from conspo.objectives.rrpo import (
    ProjectionHead,
    RRPOParams,
    anchor_agreement,
    anchor_scores,
    contrastive_loss,
    rrpo_advantages,
    rrpo_objective,
    train_projection,
)
from conspo.sink import MemorySink
from conspo.training.anchors import ANCHORS_DIR, ANCHORS_STATE, Anchors
from conspo.training.trainer import train

DT = torch.float64


def test_anchor_scores_by_hand() -> None:
    """s = z·(c⁺ − c⁻), z the unit projection of the standardised features."""
    head = ProjectionHead(
        mean=torch.tensor([1.0, 0.0, 0.0]),
        std=torch.tensor([2.0, 1.0, 1.0]),
        weight=torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
        centre=torch.tensor([0.6, -0.8]),
    )
    features = torch.tensor([[3.0, 0.0, 0.0], [1.0, 3.0, 4.0]])
    # Row 0: standardised (1, 0, 0) → (1, 0), unit (1, 0): s = 0.6.
    # Row 1: standardised (0, 3, 4) → (4, 7), unit (4, 7)/√65: s = (2.4 − 5.6)/√65.
    got = anchor_scores(head, features)
    assert got.tolist() == pytest.approx([0.6, (2.4 - 5.6) / math.sqrt(65)], rel=1e-6)


def test_contrastive_loss_by_hand() -> None:
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]], dtype=DT)
    positive = torch.tensor([True, True, False, False])
    tau = 0.5
    c_pos = torch.tensor([0.5, 0.5], dtype=DT) / math.sqrt(0.5)
    c_neg = torch.tensor([-0.2, 0.4], dtype=DT) / math.sqrt(0.2)

    def ce(row: torch.Tensor, own: torch.Tensor, other: torch.Tensor) -> float:
        a, b = float(row @ own) / tau, float(row @ other) / tau
        return -a + math.log(math.exp(a) + math.exp(b))

    pos = (ce(z[0], c_pos, c_neg) + ce(z[1], c_pos, c_neg)) / 2
    neg = (ce(z[2], c_neg, c_pos) + ce(z[3], c_neg, c_pos)) / 2
    assert contrastive_loss(z, positive, tau).item() == pytest.approx(0.5 * (pos + neg), rel=1e-9)


def policy_batch(scores: torch.Tensor | None, logprobs: torch.Tensor, old=None) -> PolicyBatch:
    return PolicyBatch(
        logprobs=logprobs,
        mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=DT),
        rewards=torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=DT),
        group_ids=torch.tensor([7, 7, 3, 3]),
        old_logprobs=old,
        anchor_scores=scores,
    )


def test_advantages_by_hand() -> None:
    logprobs = torch.zeros(4, 3, dtype=DT)
    # Before the head is frozen: GRPO's (r − mean)/std per group: (+1, −1) and (0, 0).
    assert rrpo_advantages(policy_batch(None, logprobs), RRPOParams()).tolist() == [1, -1, 0, 0]
    scores = torch.tensor([0.5, 0.1, -0.2, 0.4], dtype=DT)
    got = rrpo_advantages(policy_batch(scores, logprobs), RRPOParams())
    assert got.tolist() == pytest.approx([0.2, -0.2, -0.3, 0.3])  # group-centred, no verifier
    mixed = rrpo_advantages(policy_batch(scores, logprobs), RRPOParams(verifier_weight=2))
    assert mixed.tolist() == pytest.approx([2.2, -2.2, -0.3, 0.3])


def test_loss_and_gradient_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(11)
    logprobs = (-2 * torch.rand(4, 3, generator=gen, dtype=DT)).requires_grad_()
    old = logprobs.detach() + 0.6 * (torch.rand(4, 3, generator=gen, dtype=DT) - 0.5)
    scores = torch.tensor([0.5, 0.1, -0.2, 0.4], dtype=DT)
    batch = policy_batch(scores, logprobs, old)
    out = rrpo_objective(batch, RRPOParams(verifier_weight=1))
    adv = [1.2, -1.2, -0.3, 0.3]
    rows = []
    for i in range(4):
        n = int(batch.mask[i].sum())
        ratio = (logprobs[i, :n] - old[i, :n]).exp()
        surrogate = torch.minimum(ratio * adv[i], ratio.clamp(0.8, 1.2) * adv[i])
        rows.append(-surrogate.mean())
    want = torch.stack(rows).mean()
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-9)
    (got_grad,) = torch.autograd.grad(out.loss, logprobs)
    (want_grad,) = torch.autograd.grad(want, logprobs)
    torch.testing.assert_close(got_grad, want_grad)
    assert out.stats[M.CLIP_FRAC].item() > 0
    auc, gap = anchor_agreement(scores, batch.outcome)  # the trainer's, on the whole batch
    assert auc.item() == 1.0  # the one positive scores highest
    assert gap.item() == pytest.approx(0.5 - (0.1 - 0.2 + 0.4) / 3)


def test_agreement_counts_ties_as_half_and_is_nan_without_both_classes() -> None:
    auc, gap = anchor_agreement(torch.tensor([0.3, 0.3, 0.1, 0.5]), torch.tensor([1, 0, 0, 1]))
    # Pairs (pos, neg): (0.3, 0.3) tie ½, (0.3, 0.1) 1, (0.5, 0.3) 1, (0.5, 0.1) 1.
    assert auc.item() == pytest.approx(3.5 / 4)
    assert gap.item() == pytest.approx(0.4 - 0.2)
    auc, gap = anchor_agreement(torch.tensor([0.3, 0.1]), torch.tensor([1, 1]))
    assert math.isnan(auc.item()) and math.isnan(gap.item())


def anchor_set(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n features in 32 dims: the label moves dimension 5 by ±0.5, while dimensions 0–3 carry
    noise 20× larger (what a raw hidden state's outlier dimensions do to a cosine)."""
    gen = torch.Generator().manual_seed(seed)
    positive = torch.rand(n, generator=gen) < 0.5
    x = torch.randn(n, 32, generator=gen)
    x[:, :4] *= 20
    x[:, 5] += torch.where(positive, 0.5, -0.5) * 2
    return x, positive


def test_the_head_learns_to_separate_held_out_rollouts() -> None:
    x, positive = anchor_set(256, seed=0)
    params = RRPOParams(projection_dim=8, head_steps=150)
    head, losses = train_projection(x, positive, params, seed=4)
    assert losses[-1] < 0.7 * losses[0]
    test_x, test_positive = anchor_set(400, seed=1)
    auc, gap = anchor_agreement(anchor_scores(head, test_x), test_positive.float())
    assert auc.item() > 0.8 and gap.item() > 0  # the best linear rule's AUC here: 0.92
    again, _ = train_projection(x, positive, params, seed=4)
    assert torch.equal(again.weight, head.weight)  # one seed, one head
    with pytest.raises(ValueError, match="both a positive and a negative"):
        train_projection(x, torch.ones(256, dtype=torch.bool), params, seed=4)


def test_collection_is_stratified_per_group() -> None:
    anchors = Anchors()
    params = RRPOParams(anchors_per_stratum=2, anchor_steps=1, min_anchors=3)
    correct = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 1])
    groups = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    features = torch.arange(10.0)[:, None].expand(10, 3)
    anchors.collect(features, correct, groups, params)
    # Group 0: positives 0, 1 (of 4) and its negative 4; group 1: negatives 5, 6, positive 9.
    assert anchors.features[0][:, 0].tolist() == [0, 1, 4, 5, 6, 9]
    assert anchors.counts() == (3, 3)
    assert anchors.ready(params, 1) and not anchors.ready(
        params.model_copy(update={"anchor_steps": 2}), 1
    )
    assert not anchors.ready(params.model_copy(update={"min_anchors": 4}), 1)
    capped = Anchors()
    capped.collect(features, correct, groups, params.model_copy(update={"max_anchors": 4}))
    assert capped.features[0][:, 0].tolist() == [0, 1, 4, 5]  # the first four kept
    capped.collect(features, correct, groups, params.model_copy(update={"max_anchors": 4}))
    assert capped.counts() == (2, 2)  # full: nothing more


def rrpo_config(steps: int, **params: object) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "rrpo",
        "params": {"anchor_steps": 1, "min_anchors": 1, "head_steps": 20, **params},
        "steps": steps,
        "seed": 3,
        "model": {"name": "tiny-arith", "lora": {"rank": 4}},
        "task": {"name": "arith", "eval_size": 4},
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
        "optim": {"lr": 1e-3},
        "eval": {"every": 0, "at_start": False},
        "checkpoint": {"every": 1, "keep": 5},
    })  # fmt: skip


def test_an_rrpo_run_freezes_its_head_and_resumes_exactly(model_store, tmp_path) -> None:
    """Four steps straight against two, a resume and two more: the same metrics at every step
    (the anchors and the head come back with the checkpoint). Step 1 collects (no scores), the
    head is frozen at its end and scores every later step."""
    straight = MemorySink()
    train(rrpo_config(4), straight, workdir=tmp_path / "straight", model_store=model_store)
    steps = straight.steps
    frozen_at = next(s for s in sorted(steps) if steps[s].metrics[M.RRPO_ANCHORS] > 0)
    assert M.RRPO_ANCHOR_GAP not in steps[1].metrics  # no head yet
    assert frozen_at < 4, "no step of the tiny model gave both a positive and a negative"
    later = [s for s in steps if s > frozen_at]
    assert all(
        steps[s].metrics[M.RRPO_ANCHORS] == steps[frozen_at].metrics[M.RRPO_ANCHORS] for s in later
    )
    first = MemorySink()
    train(rrpo_config(2), first, workdir=tmp_path / "resumed", model_store=model_store)
    assert (tmp_path / "resumed/checkpoints/step_000002" / ANCHORS_DIR / ANCHORS_STATE).exists()
    second = MemorySink()
    train(rrpo_config(4), second, workdir=tmp_path / "resumed", model_store=model_store)
    assert sorted(second.steps) == [3, 4]
    for step in (3, 4):
        for key in (M.LOSS, M.RRPO_ANCHORS, M.RRPO_ANCHOR_GAP, M.GRAD_NORM):
            a, b = straight.steps[step].metrics.get(key), second.steps[step].metrics.get(key)
            assert (a is None) == (b is None), (step, key)
            assert a == pytest.approx(b, rel=1e-5, abs=1e-7, nan_ok=True), (step, key)


def test_full_fine_tuning_reads_a_frozen_reference(model_store, tmp_path) -> None:
    """Without LoRA the anchors read a frozen copy of the starting weights: the policy moving
    does not move the features the head scores."""
    sink = MemorySink()
    cfg = rrpo_config(3).model_copy(deep=True)
    cfg.model.lora.rank = 0
    train(cfg, sink, workdir=tmp_path / "full", model_store=model_store)
    assert sorted(sink.steps) == [1, 2, 3]
    assert all(math.isfinite(s.metrics[M.LOSS]) for s in sink.steps.values())


def test_what_rrpo_cannot_do_is_refused_naming_the_field() -> None:
    base = rrpo_config(2).model_dump()
    with pytest.raises(ValidationError, match="rrpo.*collects anchors.*one process"):
        RunConfig.model_validate(base | {"resources": {"gpus": 2}})
    bad = (("anchor_steps", 0), ("anchors_per_stratum", 0), ("head_lr", 0), ("max_anchors", 10**6))
    for field, value in bad:
        with pytest.raises(ValidationError, match=field):
            RunConfig.model_validate(base | {"params": base["params"] | {field: value}})
