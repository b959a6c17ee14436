"""Every metric key ConSPO Lab logs, named once (../shared/docs/objectives.md §4).

Keys are slash-namespaced snake_case (``sep/gap``, ``conspo/margin``), logged against an integer
step. The objectives, ``conspo.stats``, the trainer and the dashboard import these constants
instead of spelling the strings, and the dashboard shows ``METRIC_HELP`` next to each chart.
"""

from __future__ import annotations

# --- objective / optimiser ------------------------------------------------------------------
LOSS = "loss"
ENTROPY = "entropy"
GRAD_NORM = "grad_norm"
KL = "kl"
LR = "lr"
CLIP_FRAC = "grpo/clip_frac"

# --- separation of positive and negative scores (valid groups only) --------------------------
SEP_POS_SCORE = "sep/pos_score"
SEP_NEG_SCORE = "sep/neg_score"
SEP_GAP = "sep/gap"
SEP_GAP_MIN = "sep/gap_min"
SEP_ORDER_ACC = "sep/order_acc"
SEP_MARGIN_ACC = "sep/margin_acc"

# --- ConSPO's softmax view ----------------------------------------------------------------
CONSPO_MARGIN = "conspo/margin"
CONSPO_P_POS = "conspo/p_pos"
CONSPO_P_POS_UNIFORM = "conspo/p_pos_uniform"
CONSPO_HARD_NEG_SHARE = "conspo/hard_neg_share"

# --- GRPO's discriminative view (Proposition 1) ----------------------------------------------
GRPO_WEIGHT = "grpo/weight"
GRPO_CLIP_GAP = "grpo/clip_gap"

# --- batch composition ----------------------------------------------------------------------
BATCH_PASS_RATE = "batch/pass_rate"
BATCH_VALID_GROUPS = "batch/valid_groups"
BATCH_ALL_POS_GROUPS = "batch/all_pos_groups"
BATCH_ALL_NEG_GROUPS = "batch/all_neg_groups"
LEN_POS = "len/pos"
LEN_NEG = "len/neg"

# --- evaluation -----------------------------------------------------------------------------
EVAL_ACCURACY = "eval/accuracy"
EVAL_PASS_AT_K = "eval/pass@k"

# --- time and throughput --------------------------------------------------------------------
TIME_STEP_S = "time/step_s"
TIME_ROLLOUT_S = "time/rollout_s"
THROUGHPUT_ROLLOUTS_PER_S = "throughput/rollouts_per_s"
ROLLOUTS_SEEN = "rollouts/seen"

# The keys conspo.stats.separation_stats returns, in display order.
SEPARATION_KEYS: tuple[str, ...] = (
    SEP_POS_SCORE,
    SEP_NEG_SCORE,
    SEP_GAP,
    SEP_GAP_MIN,
    SEP_ORDER_ACC,
    SEP_MARGIN_ACC,
    CONSPO_MARGIN,
    CONSPO_P_POS,
    CONSPO_P_POS_UNIFORM,
    CONSPO_HARD_NEG_SHARE,
    GRPO_WEIGHT,
    GRPO_CLIP_GAP,
    BATCH_PASS_RATE,
    BATCH_VALID_GROUPS,
    BATCH_ALL_POS_GROUPS,
    BATCH_ALL_NEG_GROUPS,
    LEN_POS,
    LEN_NEG,
)

METRIC_HELP: dict[str, str] = {
    LOSS: "Objective value being minimised (its meaning depends on the algorithm).",
    ENTROPY: "Mean per-token entropy of the policy on the sampled responses.",
    GRAD_NORM: "Gradient norm before clipping.",
    KL: "k3 estimate of KL(π_θ ‖ π_ref) per token, when a reference model is loaded.",
    LR: "Learning rate used for this step.",
    CLIP_FRAC: "GRPO-family: fraction of response tokens whose ratio was clipped.",
    SEP_POS_SCORE: "Mean length-normalised log-prob of correct rollouts (valid groups).",
    SEP_NEG_SCORE: "Mean length-normalised log-prob of wrong rollouts (valid groups).",
    SEP_GAP: "sep/pos_score − sep/neg_score: how far correct rollouts score above wrong ones.",
    SEP_GAP_MIN: "Worst case per group, min s⁺ − max s⁻; > 0 means every pair is ordered.",
    SEP_ORDER_ACC: "Fraction of (correct, wrong) pairs in a group with s⁺ > s⁻.",
    SEP_MARGIN_ACC: "Fraction of (correct, wrong) pairs with s⁺ − m_t > s⁻.",
    CONSPO_MARGIN: "Current margin m_t of the ConSPO curriculum.",
    CONSPO_P_POS: "Mean softmax probability P⁺ of each correct rollout against the group's"
    " wrong ones.",
    CONSPO_P_POS_UNIFORM: "Reference for conspo/p_pos when scores carry no signal: 1/(1+N⁻).",
    CONSPO_HARD_NEG_SHARE: "Share of the push-down that goes to the highest-scoring wrong"
    " rollout (1/N⁻ = spread evenly, 1 = all on one).",
    GRPO_WEIGHT: "Mean sqrt(p̂(1−p̂)): GRPO's per-group weight on the score gap.",
    GRPO_CLIP_GAP: "Gap of GRPO's clipped-ratio scores, mean s⁺_clip − mean s⁻_clip.",
    BATCH_PASS_RATE: "Fraction of all rollouts of the step that were verified correct.",
    BATCH_VALID_GROUPS: "Groups with both correct and wrong rollouts (the ones that train).",
    BATCH_ALL_POS_GROUPS: "Groups whose rollouts were all correct (no contrast).",
    BATCH_ALL_NEG_GROUPS: "Groups whose rollouts were all wrong (no contrast).",
    LEN_POS: "Mean response length (tokens incl. EOS) of correct rollouts.",
    LEN_NEG: "Mean response length (tokens incl. EOS) of wrong rollouts.",
    EVAL_ACCURACY: "Greedy accuracy on the held-out split.",
    EVAL_PASS_AT_K: "pass@k on the held-out split (sampled).",
    TIME_STEP_S: "Wall-clock seconds of the whole step.",
    TIME_ROLLOUT_S: "Wall-clock seconds spent generating rollouts.",
    THROUGHPUT_ROLLOUTS_PER_S: "Rollouts generated per second of step time.",
    ROLLOUTS_SEEN: "Rollouts generated since the start of the run.",
}
