"""The metric catalogue: every key ConSPO Lab logs, described once (docs/objectives.md §4).

Keys are slash-namespaced snake_case (``sep/gap``, ``optim/lr``) logged against an integer step.
Each key is described here once: a legend label, a help line, its unit, the chart that draws it,
which runs log it (every run, or only objectives that declare it), and whether it is
deterministic (a schedule, the learning rate, a counter: never smoothed, never treated as noise).
The charts and their sections are described here too.

Who reads it: the objectives, ``conspo.training.stats`` and the trainer import the key constants
below instead of spelling strings; the backend serves ``catalogue()`` (``GET
/api/metrics/catalogue``, also injected into every page) and the run, runs and compare pages render
their charts from it; the CLI takes its key metrics and each metric's better direction from it; the
TRL bridge maps TRL's keys onto these constants. No metric key is typed anywhere else (tests/conspo/
test_metrics.py and tests/lab/test_catalogue.py hold every producer and page to it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Literal

# --- objective / optimiser ------------------------------------------------------------------
LOSS = "optim/loss"
GRAD_NORM = "optim/grad_norm"
LR = "optim/lr"
ENTROPY = "policy/entropy"
ENTROPY_POS = "policy/entropy_pos"
ENTROPY_NEG = "policy/entropy_neg"
KL = "policy/kl"
KL_IN_REWARD = "policy/kl_in_reward"
CLIP_FRAC = "grpo/clip_frac"
OPTIM_UPDATES = "optim/updates"
OPTIM_SKIPPED = "optim/skipped"
OPTIM_BACKWARD_SKIPPED = "optim/backward_skipped"
OPTIM_UPDATE_SIZE = "optim/update_size"

# --- how off-policy each update was (importance ratio π_θ / π_old over response tokens) -------
OFFPOLICY_RATIO_MEAN = "offpolicy/ratio_mean"
OFFPOLICY_RATIO_MAX = "offpolicy/ratio_max"
OFFPOLICY_RATIO_MIN = "offpolicy/ratio_min"
OFFPOLICY_CLIP_LOW = "offpolicy/clip_low"
OFFPOLICY_CLIP_HIGH = "offpolicy/clip_high"
# the sampler (μ: vLLM, the native decode) against the trainer's π_old on the same tokens
# (conspo.training.mismatch)
MISMATCH_LOGP_DIFF_MEAN = "mismatch/logp_diff_mean"
MISMATCH_LOGP_DIFF_MAX = "mismatch/logp_diff_max"
MISMATCH_KL = "mismatch/kl"
MISMATCH_WEIGHT_MEAN = "mismatch/weight_mean"
MISMATCH_CORRECTED_FRAC = "mismatch/corrected_frac"
# asynchronous generation (sampling.max_staleness; conspo.training.pipeline)
ASYNC_POLICY_LAG = "async/policy_lag"
ASYNC_TRAINER_WAIT_S = "async/trainer_wait_s"
ASYNC_GENERATOR_IDLE_S = "async/generator_idle_s"

# --- what single baselines (conspo/objectives/) add ----------------------------------------
SAPO_GATE_WEIGHT = "sapo/gate_weight"
DISCO_KL = "disco/kl"
DISCO_CONSTRAINT_ACTIVE = "disco/constraint_active"
MCPO_KL_MASTERED = "mcpo/kl_mastered"
MCPO_HINGE_ACTIVE = "mcpo/hinge_active"
ISPO_HINGE_ACTIVE = "ispo/hinge_active"
# PPO's critic (conspo.objectives.ppo, conspo.training.critic)
PPO_ADV_STD = "ppo/adv_std"
PPO_RETURN_MEAN = "ppo/return_mean"
PPO_VALUE_MEAN = "ppo/value_mean"
PPO_EXPLAINED_VAR = "ppo/explained_var"
PPO_VALUE_LOSS = "ppo/value_loss"
PPO_VALUE_CLIP_FRAC = "ppo/value_clip_frac"
# RRPO's frozen anchors (conspo.objectives.rrpo, conspo.training.anchors)
RRPO_ANCHOR_AUC = "rrpo/anchor_auc"
RRPO_ANCHOR_GAP = "rrpo/anchor_gap"
RRPO_ANCHORS = "rrpo/anchors"

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
BATCH_REWARD_LOST = "batch/reward_lost"
BATCH_VALID_GROUPS = "batch/valid_groups"
BATCH_ALL_POS_GROUPS = "batch/all_pos_groups"
BATCH_ALL_NEG_GROUPS = "batch/all_neg_groups"
LEN_POS = "len/pos"
LEN_NEG = "len/neg"
LEN_TRUNCATED_FRAC = "len/truncated_frac"
BATCH_SHORTFALL_GROUPS = "batch/shortfall_groups"
BATCH_REFILL_ROUNDS = "batch/refill_rounds"

# --- job kinds other than rl (conspo/jobs/) ----------------------------------------------------
SFT_TOKEN_ACC = "sft/token_acc"
SFT_TOKENS = "sft/answer_tokens"
RFT_ACCEPTED = "rft/accepted"  # rejection sampling (conspo.jobs.rejection_sampling): a round's draw
RFT_KEPT = "rft/kept"
RFT_PROMPTS_KEPT = "rft/prompts_kept"
RFT_POOL = "rft/pool"
DISTILL_REVERSE_KL = "distill/reverse_kl"
DISTILL_TEACHER_LOGPROB = "distill/teacher_logprob"
DISTILL_LENGTH = "distill/length"
DPO_ACCURACY = "dpo/accuracy"
DPO_MARGIN = "dpo/margin"
DPO_CHOSEN = "dpo/chosen_reward"
DPO_REJECTED = "dpo/rejected_reward"
KTO_ACCURACY = "kto/accuracy"
KTO_REWARD_DESIRABLE = "kto/reward_desirable"
KTO_REWARD_UNDESIRABLE = "kto/reward_undesirable"
KTO_KL = "kto/kl"
KTO_WEIGHT_RATIO = "kto/desirable_weight_ratio"
RM_ACCURACY = "rm/accuracy"
RM_MARGIN = "rm/margin"

# --- evaluation -----------------------------------------------------------------------------
EVAL_ACCURACY = "eval/accuracy"
EVAL_PASS_AT_K = "eval/pass@k"
EVAL_PROBLEMS = "eval/problems"
EVAL_RM_ACCURACY = "eval/rm_accuracy"  # a reward model's held-out pairs (conspo.jobs.reward_model)
EVAL_RM_MARGIN = "eval/rm_margin"

# --- tools inside rollouts (conspo.tools, conspo.generation.tool_rollout) --------------------
TOOLS_CALLS = "tools/calls"
TOOLS_CALLS_POS = "tools/calls_pos"
TOOLS_CALLS_NEG = "tools/calls_neg"
TOOLS_CALL_RATE = "tools/call_rate"
TOOLS_ACC_WITH_CALL = "tools/acc_with_call"
TOOLS_ACC_WITHOUT_CALL = "tools/acc_without_call"
TOOLS_OK_RATE = "tools/ok_rate"
TOOLS_ERROR_RATE = "tools/error_rate"
TOOLS_TIMEOUT_RATE = "tools/timeout_rate"
TOOLS_TURNS = "tools/turns"
TOOLS_OBSERVATION_TOKENS = "tools/observation_tokens"
TIME_TOOLS_S = "time/tools_s"
TIME_SANDBOX_S = "time/sandbox_s"
# The proxy-vs-truth view: what the objective trains on (the shaped reward) against the truth
PROXY_REWARD = "proxy/reward"
PROXY_TRUTH = "proxy/truth"
PROXY_GAP = "proxy/gap"
PROXY_AGREEMENT = "proxy/agreement"
PROXY_SPEARMAN = "proxy/spearman"
EVAL_PROXY_REWARD = "eval/proxy_reward"  # the same on the held-out pass@k samples
EVAL_PROXY_TRUTH = "eval/proxy_truth"
EVAL_PROXY_AGREEMENT = "eval/proxy_agreement"
EVAL_PROXY_SPEARMAN = "eval/proxy_spearman"
EVAL_BEST_OF_N = "eval/best_of_n"  # eval.best_of: the pick of a reward among pass_k samples
EVAL_SAMPLE_ACCURACY = "eval/sample_accuracy"
ENV_TURNS = "env/turns"
ENV_TURNS_POS = "env/turns_pos"
ENV_TURNS_NEG = "env/turns_neg"
ENV_SUCCESS = "env/success"
ENV_RETURN = "env/return"
ENV_TURN_REWARD = "env/turn_reward"
ENV_FAILED = "env/failed"
ENV_TRUNCATED = "env/truncated"
ENV_INVALID = "env/invalid"
ENV_OBSERVATION_TOKENS = "env/observation_tokens"
TIME_ENV_S = "time/env_s"
EVAL_TOOL_CALL_RATE = "eval/tool_call_rate"
EVAL_ENV_TURNS = "eval/env_turns"

# --- time and throughput --------------------------------------------------------------------
TIME_STEP_S = "time/step_s"
TIME_ROLLOUT_S = "time/rollout_s"
TIME_EVAL_S = "time/eval_s"
THROUGHPUT_ROLLOUTS_PER_S = "throughput/rollouts_per_s"
ROLLOUTS_SEEN = "rollouts/seen"

# --- system (conspo.system: sampled every few seconds, handed over once per step) -------------
SYS_CPU_PERCENT = "system/cpu_percent"
SYS_RSS_GIB = "system/rss_gib"
SYS_PEAK_RSS_GIB = "system/peak_rss_gib"
SYS_AVAILABLE_GIB = "system/available_gib"
GPU_READINGS = ("util", "mem_gib", "mem_total_gib", "power_w", "temp_c")


def sys_gpu_key(index: int, reading: str) -> str:
    """The key of one GPU's reading (``GPU_READINGS``): system/gpu0/util, ..."""
    return f"system/gpu{index}/{reading}"


# The keys conspo.training.stats.separation_stats returns, in display order.
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

# What `conspo-lab watch` / `compare` print and the compare page opens with, in this order.
KEY_METRICS: tuple[str, ...] = (
    SEP_GAP,
    SEP_ORDER_ACC,
    SEP_POS_SCORE,
    SEP_NEG_SCORE,
    BATCH_PASS_RATE,
    EVAL_ACCURACY,
    GRAD_NORM,
    OPTIM_UPDATE_SIZE,
)

# What every job kind logs besides the keys its registration declares (``metrics=``): the learning
# rate and step time of each step, and the held-out evaluation's time when it is due (the shared
# loop, conspo.training.loop.one_update_per_step, and the RL trainer alike). A kind that trains an
# algorithm (rl) also logs the "every run" keys and its objective's.
EVERY_KIND: tuple[str, ...] = (LR, TIME_STEP_S, TIME_EVAL_S)
# What the task's held-out evaluation (generated answers, verified) logs: every kind whose model
# generates (RegisteredJobKind.head "causal_lm"); a reward model scores its own held-out pairs
# instead and declares those keys.
TASK_EVAL: tuple[str, ...] = (EVAL_ACCURACY, EVAL_PASS_AT_K, EVAL_PROBLEMS)

# Keys written before the top-level ones were namespaced (migration 0003 renamed them in stored
# worker runs); readers of older exports can map them with this.
LEGACY_KEYS: dict[str, str] = {
    "loss": LOSS,
    "grad_norm": GRAD_NORM,
    "lr": LR,
    "entropy": ENTROPY,
    "kl": KL,
}


# --------------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------------

# Palette roles, not colours: the pages map them (pos = correct rollouts, neg = wrong ones).
ColorRole = Literal["pos", "neg", "accent", "accent2", "accent3", "reference"]


@dataclass(frozen=True)
class Section:
    """A group of panels. ``needs``: the config under which its panels say anything (see
    ``Chart.needs``); otherwise the section is folded with the line ``folded``.
    ``folded_without``: a key prefix; a run that logged system metrics but no key with it shows
    the section folded with ``folded`` (the GPU panels of a run whose worker read no GPU)."""

    id: str
    title: str
    needs: str = ""
    folded: str = ""
    folded_without: str = ""


@dataclass(frozen=True)
class Chart:
    """One panel. Its lines are the metrics whose ``chart`` is this id, in catalogue order.

    kind: line (one line per metric), stack (stacked areas of counts), or a view of the sampled
    rollouts rather than of metrics (rollout_heatmap: steps × score bins, one panel per class,
    on shared bins). y_range: auto, unit (exactly [0, 1], for fractions) or zero (auto, but
    always including 0). y_format: a d3 tick format for values whose SI prefix reads badly
    (the learning rate: "3e-5", not "30μ"). always: drawn (with a placeholder) before any data
    arrives. algorithms: the runs the panel applies to (empty: every run); a panel whose view
    belongs to one objective (ConSPO's margin schedule) is hidden on other runs' pages. kinds:
    the job kinds it applies to (default rl; empty: every kind, e.g. the held-out eval).
    logged_with: a key some objectives declare they log; the panel applies to runs of those
    objectives only (their registrations say which, ``Catalogue.objective_metrics``). needs: a
    condition on the run's config without which its series are constant, so the panel is not
    drawn: config paths, each truthy or compared (``path>1``), joined by ``|`` (any of them).
    """

    id: str
    title: str
    section: str
    y_title: str
    kind: Literal["line", "stack", "rollout_heatmap"] = "line"
    y_range: Literal["auto", "unit", "zero"] = "auto"
    y_format: str = ""
    algorithms: tuple[str, ...] = ()
    # The job kinds (config.kind) whose runs the panel applies to; empty: every kind.
    kinds: tuple[str, ...] = ("rl",)
    zero_line: bool = False
    always: bool = False
    markers: bool = False  # eval points are sparse: show them
    rollout_iqr: bool = False  # draw the sampled rollouts' score IQR behind the lines
    help: str = ""
    logged_with: str = ""
    needs: str = ""
    # "wall_time": drawn against wall-clock time whatever the page's x axis (system readings,
    # sampled by the clock rather than by step); "run": the page's choice.
    x_axis: Literal["run", "wall_time"] = "run"


@dataclass(frozen=True)
class Metric:
    """One key. ``logged_by``: "every run" (the trainer or the separation statistics log it
    whatever the objective) or "objective" (only objectives that return it, e.g. GRPO's clip
    fraction). ``when``: a further condition, said in words. ``better``: which direction is an
    improvement, when there is one ("" for descriptive keys such as the score means).
    ``constant_note``: why the series may be constant, said on its panel when it is (e.g. GRPO's
    clip fraction is exactly 0 while every update is on-policy)."""

    key: str
    label: str
    help: str
    unit: str
    chart: str | None  # None: not drawn on its own (an x axis)
    logged_by: Literal["every run", "objective"] = "every run"
    when: str = ""
    deterministic: bool = False
    better: Literal["higher", "lower", ""] = ""
    color: ColorRole = "accent"
    dash: bool = False
    constant_note: str = ""
    smoothed: bool = True  # False: a page never smooths it (a reading, not a noisy estimate)


@dataclass(frozen=True)
class MetricPattern:
    """A family of keys whose names a config chooses, e.g. eval/<benchmark>/avg@<k>: described
    once; ``regex`` (JavaScript-compatible) tells a page which logged keys it covers."""

    pattern: str
    regex: str
    label: str
    help: str
    unit: str
    when: str = ""
    better: Literal["higher", "lower", ""] = ""
    section: str = "eval"  # where a page draws each matching key (one chart per key)
    y_range: Literal["auto", "unit", "zero"] = "auto"
    # Keys of the family that repeat another key's series (drawn there, not again): key → it.
    same_as: dict[str, str] = field(default_factory=dict)
    smoothed: bool = True
    x_axis: Literal["run", "wall_time"] = "run"


@dataclass(frozen=True)
class Catalogue:
    sections: list[Section]
    charts: list[Chart]
    metrics: list[Metric]
    key_metrics: list[str]  # watch / compare defaults
    rollouts_axis: str  # the key giving rollouts seen, for the "rollouts seen" x axis
    step_time: str  # the key giving seconds per step, for ETAs from the recent pace
    # the key giving the held-out problems an evaluation scored (its n), for "n of asked"
    eval_problems: str
    eval_accuracy: str
    # algorithm → the keys logged by "objective" that it logs (its registration declares them);
    # every algorithm also logs the "every run" keys.
    objective_metrics: dict[str, list[str]] = field(default_factory=dict)
    # job kind → the keys it logs (its registration declares them; conspo.jobs).
    kind_metrics: dict[str, list[str]] = field(default_factory=dict)
    legacy_keys: dict[str, str] = field(default_factory=dict)
    patterns: list[MetricPattern] = field(default_factory=list)
    # every key a panel draws, in the page's order (section, chart, then catalogue order): the
    # run page asks for these series first, in the request its <head> sends (early.js)
    charted_keys: list[str] = field(default_factory=list)


# The config under which an update can be off-policy: more than one optimiser update per batch.
OFF_POLICY = "optim.mini_batches>1|optim.epochs>1"

SECTIONS: tuple[Section, ...] = (
    Section("sep", "Separation of positive and negative scores"),
    Section("dist", "Score distributions (sampled rollouts)"),
    Section("batch", "Rewards and batch composition"),
    Section("eval", "Evaluation and lengths"),
    Section("opt", "Optimisation"),
    Section(
        "offpolicy",
        "How off-policy each update was",
        needs=OFF_POLICY,
        folded="nothing to show: one optimiser update per rollout batch (optim.mini_batches"
        " = optim.epochs = 1), so π_θ = π_old and every ratio is 1",
    ),
    # drawn where a run logged it: its engine reports the probabilities it sampled with
    Section("mismatch", "Sampler against trainer"),
    Section(
        "async",
        "Asynchronous generation",
        needs="sampling.max_staleness",
        folded="synchronous (sampling.max_staleness 0): each step's rollouts come from the"
        " policy it trains, generated while the trainer waits",
    ),
    # drawn where a run logged it: an objective with a critic (PPO)
    Section("critic", "Critic: values, returns and GAE"),
    # drawn where a run logged it: an objective that scores rollouts against anchors (RRPO)
    Section("anchors", "Anchors: the frozen head against the verifier"),
    Section(
        "tools",
        "Tools inside rollouts",
        needs="tools.names",
        folded="this run calls no tools (tools.names is empty): every rollout is one answer",
    ),
    Section(
        "env",
        "Environment episodes",
        needs="task.params.environment",
        folded="this run plays no environment (its task has no params.environment): every rollout"
        " is one answer",
    ),
    # drawn where a run logged it: a reward besides the truth has a weight
    Section("proxy", "Proxy reward against the truth"),
    Section("job", "Training (SFT, distillation, DPO)"),
    Section("speed", "Speed"),
    Section("system", "System: the training process and the machine"),
    Section(
        "gpu",
        "System: GPUs",
        folded="no GPU readings: a CPU run, or its worker could not read NVML (nvidia-ml-py"
        " and an NVIDIA driver)",
        folded_without="system/gpu",
    ),
)

SCORE = "log-prob / token"
# When the mismatch/* keys are logged.
MISMATCH_WHEN = "the engine reports what it sampled with (native at temperature > 0, vllm)"
# Why the off-policy diagnostics sit still: said on their panels when they are constant.
ON_POLICY = "no ratio left 1: π_θ = π_old (on-policy, one optimiser update per rollout batch)"

CHARTS: tuple[Chart, ...] = (
    Chart("scores", "Mean score: positive vs negative", "sep", f"score s_θ ({SCORE})",
          always=True, rollout_iqr=True,
          help="Mean length-normalised log-prob of correct (s⁺) and wrong (s⁻) rollouts in"
          " valid groups; band = IQR of the sampled rollouts."),
    Chart("gap", "Score gap", "sep", f"s⁺ − s⁻ ({SCORE})", always=True, zero_line=True,
          help="sep/gap = mean s⁺ − mean s⁻; sep/gap_min = min s⁺ − max s⁻ (> 0: every pair"
          " ordered)."),
    Chart("acc", "Ordering accuracy", "sep", "fraction of pairs", always=True, y_range="unit",
          help="Fraction of (positive, negative) pairs with s⁺ > s⁻, and with s⁺ − m_t > s⁻."),
    Chart("margin", "ConSPO margin m_t (schedule)", "sep", f"m_t ({SCORE})", y_range="zero",
          algorithms=("conspo",),
          help="The margin curriculum of the run's own ConSPO schedule (drawn unsmoothed)."),
    Chart("ppos", "Softmax P⁺ vs uniform reference", "sep", "probability P⁺", y_range="unit",
          algorithms=("conspo",)),
    Chart("hardneg", "Hard-negative share", "sep", "share of push-down", y_range="unit",
          algorithms=("conspo",)),
    Chart("grpo", "GRPO's discriminative view", "sep", "weight / clipped-score gap",
          logged_with=CLIP_FRAC),
    Chart("dist", "Score distribution over steps: correct vs wrong", "dist",
          f"score s_θ ({SCORE})", kind="rollout_heatmap", always=True,
          help="Share of each class's sampled rollouts per score bin at each step (columns sum"
          " to 1), correct above and wrong below, on the same bins: the separation shows as the"
          " two bright bands moving apart."),
    Chart("reward", "Pass rate", "batch", "fraction of rollouts", always=True, y_range="unit"),
    Chart("groups", "Group mix: all-correct / mixed / all-wrong", "batch", "groups",
          kind="stack", always=True,
          help="Per step: groups with all rollouts correct, mixed (the ones that train), all"
          " wrong."),
    Chart("refill", "Dynamic sampling", "batch", "groups / rounds", y_range="zero",
          needs="params.refill_groups",
          help="Groups the batch lacked after the last refill round (params.max_refill_rounds),"
          " and the extra rounds drawn."),
    Chart("evalc", "Held-out accuracy", "eval", "accuracy (fraction)", y_range="unit",
          markers=True, kinds=()),
    Chart("len", "Response length: positive vs negative", "eval", "tokens (incl. EOS)"),
    Chart("truncated", "Answers cut at max_new_tokens", "eval", "fraction of rollouts",
          y_range="unit",
          help="Rollouts that reached sampling.max_new_tokens without an end token: their answer"
          " was cut, and a verifier reading the end of it sees none."),
    Chart("loss", "Loss", "opt", "objective value", zero_line=True, kinds=()),
    Chart("gradnorm", "Gradient norm", "opt", "‖g‖ before clipping", y_range="zero", kinds=()),
    Chart("updatesize", "Update size", "opt", "‖Δθ‖ / ‖θ‖ per step", y_range="zero",
          y_format="~e",
          help="The relative change of the trainable parameters over the step: what the"
          " learning rate, the optimiser and the objective's gradient scale add up to. Compare it"
          " across objectives before reading their curves as the objectives' doing."),
    Chart("entropy", "Entropy", "opt", "nats / token", y_range="zero"),
    Chart("kl", "KL to reference", "opt", "nats / token", y_range="zero"),
    Chart("klreward", "KL penalty in the reward", "opt", "nats / rollout", zero_line=True,
          help="Σ_t (log π_old − log π_ref) over a rollout's tokens, the mean over the step's"
          " rollouts: what params.kl_in_reward (β) times takes off each reward before the"
          " advantages (InstructGPT's KL in the reward)."),
    Chart("lr", "Learning rate", "opt", "learning rate", y_range="zero", y_format="~e",
          kinds=()),
    Chart("clipfrac", "Clip fraction", "opt", "fraction of tokens", y_range="unit"),
    Chart("oldkl", "KL to the rollout policy π_old", "opt", "nats / token", y_range="zero",
          help="How far the trained policy moved from the one that generated the batch, as the"
          " objectives that constrain it measure it (0 with one update per rollout batch)."),
    Chart("constraint", "Trust-region constraint active", "opt", "fraction", y_range="unit"),
    Chart("gate", "SAPO's soft gate", "opt", "gradient weight per token", y_range="zero"),
    Chart("updates", "Optimiser steps per step", "opt", "optimiser steps", y_range="zero",
          help="optim.epochs × optim.mini_batches, less the updates without gradient (no signal);"
          " skipped = 1 when the whole step took none."),
    Chart("ratio", "Importance ratio π_θ / π_old", "offpolicy", "ratio", always=True,
          help="Over the response tokens of each update: mean (over updates), largest and"
          " smallest. 1 throughout with one update per rollout batch."),
    Chart("clipside", "Tokens outside the trust region, per side", "offpolicy",
          "fraction of tokens", y_range="unit", always=True,
          help="Fraction of response tokens with ρ < 1 − ε_low and with ρ > 1 + ε_high (the"
          " objective's own clip range; ConSPO's ε for objectives without one)."),
    Chart("mismatchlogp", "Sampler vs trainer log-prob gap", "mismatch", "|Δ log p| per token",
          y_range="zero",
          help="|log π_old − log μ| over the model's tokens, mean and largest: how far the"
          " probabilities the engine sampled with (μ) are from the trainer's on the same tokens."
          " Kernels, bf16 and stale weights widen it."),
    Chart("mismatchkl", "KL(sampler ‖ trainer)", "mismatch", "nats / token", y_range="zero",
          help="KL(μ ‖ π_old) per token, estimated on μ's own samples (k3)."),
    Chart("mismatchweight", "Mismatch correction", "mismatch", "weight / fraction",
          y_range="zero",
          help="The mean importance weight π_old/μ the correction gives (sampling."
          "mismatch_correction; 1 when off) and the share of tokens or rollouts past the cap C"
          " (truncated or masked; with the correction off, the share that would be)."),
    Chart("asynclag", "Policy lag of the rollouts", "async", "updates", y_range="zero",
          needs="sampling.max_staleness",
          help="How many updates older than the trainer's policy the weights that sampled the"
          " step's rollouts were: k (sampling.max_staleness) once the first k + 1 steps, sampled"
          " by the starting weights, are past."),
    Chart("asyncwait", "Waiting on each side", "async", "seconds", y_range="zero",
          needs="sampling.max_staleness",
          help="How long the trainer waited for the step's rollouts (generation slower than"
          " the update), and how long the generating thread sat idle before it began them"
          " (k batches ahead already: the update slower). Near 0 on both: the overlap is"
          " complete."),
    Chart("criticvalues", "Critic: values against returns", "critic", "return",
          algorithms=("ppo",),
          help="Mean value V the critic predicted when the rollouts were scored, and the mean"
          " GAE return R = Â + V it is regressed onto, at its targets (every model token; each"
          " turn's first token in an environment)."),
    Chart("criticfit", "Critic: explained variance", "critic", "1 − Var(R − V)/Var(R)",
          algorithms=("ppo",), zero_line=True,
          help="1: the critic predicts the returns; 0: no better than their mean; below 0:"
          " worse. GAE's advantages are only as good as this."),
    Chart("criticloss", "Critic: value loss", "critic", "loss / fraction", y_range="zero",
          algorithms=("ppo",),
          help="The critic's clipped value loss ½·max((V − R)², (clip(V) − R)²) over its"
          " updates, and the share of targets where the clipped term was the larger."),
    Chart("advspread", "GAE advantage spread", "critic", "std of Â", y_range="zero",
          algorithms=("ppo",),
          help="Std of the token advantages before whitening: 0 means no token is credited"
          " differently from another."),
    Chart("anchoragree", "Anchor scores against the verifier", "anchors", "AUC",
          y_range="unit", algorithms=("rrpo",),
          help="Once the projection head is frozen: the chance that a rollout the verifier"
          " passed scores above one it failed, by their scores against the anchors (0.5: the"
          " head tells them apart no better than chance). Empty while anchors are collected."),
    Chart("anchorgap", "Anchor score gap", "anchors", "score", algorithms=("rrpo",),
          zero_line=True,
          help="Mean anchor score s = cos(z, c⁺) − cos(z, c⁻) of the passed rollouts less the"
          " failed ones' (s lies in [−2, 2]): above 0, the head scores what the verifier passed"
          " nearer the positive anchors."),
    Chart("anchorsets", "Anchors the head was trained on", "anchors", "anchors",
          y_range="zero", algorithms=("rrpo",),
          help="Positive and negative anchors together, 0 until the head is frozen (at the end"
          " of params.anchor_steps, or later if a set had fewer than params.min_anchors)."),
    Chart("toolcalls", "Tool calls per rollout: correct vs wrong", "tools", "calls / rollout",
          y_range="zero", always=True,
          help="Do the rollouts that end right call the tool more than the ones that end wrong?"
          " Mean calls of every rollout, of the correct ones and of the wrong ones."),
    Chart("toolpay", "Does calling pay? Pass rate with and without a call", "tools",
          "fraction", y_range="unit",
          help="Pass rate of the rollouts that called a tool at least once, of those that did"
          " not, and the share of rollouts that called."),
    Chart("toolstatus", "How calls ended", "tools", "fraction of calls", y_range="unit",
          help="Share of the step's calls that ran to the end, failed (an exception, a non-zero"
          " exit) or were killed at tools.timeout_s."),
    Chart("tooltokens", "Turns and interpreter tokens per rollout", "tools", "per rollout",
          y_range="zero",
          help="Model turns (calls + 1) and the interpreter's tokens in each rollout: context"
          " the model reads, which no loss or score counts."),
    Chart("bestofn", "Best-of-N: a reward's pick among eval.pass_k samples", "eval",
          "fraction of problems", y_range="unit", markers=True, kinds=(),
          help="eval.best_of: the share of held-out problems whose sample the reward scores"
          " highest is verified correct, against one sample (pass@1 at eval.temperature);"
          " pass@k, any of the N, is its ceiling (the pass@k panel)."),
    Chart("proxytruth", "What the run trains on vs the truth", "proxy", "mean reward",
          zero_line=True,
          help="Mean over the step's rollouts of the shaped reward the objective trains on (the"
          " proxy: Σ weight · reward) and of the truth (the config's truth reward, the verifier"
          " by default), and their gap. Goodhart: the proxy keeps rising while the truth stalls"
          " or falls. The gap is in the truth's units only when the proxy is on its scale."),
    Chart("proxyrank", "Does the proxy still rank like the truth?", "proxy", "agreement",
          y_range="auto", zero_line=True,
          help="Within each prompt's group, the share of (right, wrong) pairs the proxy orders"
          " right (ties half; 0.5 is chance), and Spearman's rank correlation of proxy and"
          " truth over the step's rollouts. Falling while the proxy rises: the policy found"
          " what the proxy rewards and the truth does not."),
    Chart("envturns", "Turns per episode: correct vs wrong", "env", "turns / episode",
          y_range="zero", always=True,
          help="Do the episodes that end right finish in fewer turns? Mean turns of every"
          " episode, of the won ones and of the lost ones."),
    Chart("envoutcome", "How episodes ended", "env", "fraction of episodes", y_range="unit",
          help="Share of the step's episodes won, failed by the environment (it raised, hung,"
          " returned a wrong type or a non-finite reward) and cut by the turn limit or the"
          " token budget; and the share of turns the environment called invalid."),
    Chart("envtokens", "Environment tokens per rollout", "env", "tokens / rollout",
          y_range="zero",
          help="The environment's turns in each rollout, as tokens: context the model reads,"
          " which no loss or score counts, and which count against sampling.max_new_tokens."),
    Chart("envreward", "Environment reward", "env", "reward",
          help="Mean return of an episode (the environment's final reward, else the sum of its"
          " turns') and mean reward of one turn."),
    Chart("sft", "SFT: answer-token accuracy", "job", "fraction of answer tokens",
          y_range="unit", kinds=("sft", "rejection_sampling"), always=True,
          help="Share of the target's tokens the model predicts first (argmax), teacher-forced."),
    Chart("sfttokens", "SFT: answer tokens per step", "job", "tokens", y_range="zero",
          kinds=("sft", "rejection_sampling")),
    Chart("rftaccept", "Rejection sampling: each round's draw", "job", "fraction",
          y_range="unit", kinds=("rejection_sampling",), always=True, markers=True,
          help="At each round's first step: the share of the sampled answers the accept reward"
          " passed, and the share of the round's prompts with at least one kept answer."),
    Chart("rftkept", "Rejection sampling: answers kept", "job", "answers", y_range="zero",
          kinds=("rejection_sampling",), markers=True,
          help="The round's kept answers (passed, distinct, capped per prompt) and the pool the"
          " SFT steps draw from."),
    Chart("distill", "Distillation: reverse KL to the teacher", "job", "nats / token",
          y_range="zero", kinds=("distill",), always=True,
          help="KL(π_θ ‖ π_teacher) at each response position of the student's own samples."),
    Chart("distilllp", "Distillation: teacher log-prob of the student's tokens", "job",
          "log-prob / token", kinds=("distill",)),
    Chart("distilllen", "Distillation: response length", "job", "tokens (incl. EOS)",
          y_range="zero", kinds=("distill",)),
    Chart("dpoacc", "DPO: preference accuracy", "job", "fraction of pairs", y_range="unit",
          kinds=("dpo",), always=True,
          help="Share of the step's pairs whose implicit reward ranks chosen above rejected."),
    Chart("dporeward", "DPO: implicit rewards β·log π_θ/π_ref", "job", "reward", zero_line=True,
          kinds=("dpo",)),
    Chart("ktoacc", "KTO: completions on their side of the reference point", "job",
          "fraction of completions", y_range="unit", kinds=("kto",), always=True,
          help="Share of the step's completions whose log π_θ/π_ref is above the reference"
          " point z₀ for a desirable one, below it for an undesirable one (0 at the first step,"
          " where π_θ = π_ref)."),
    Chart("ktoreward", "KTO: implicit rewards β·log π_θ/π_ref", "job", "reward",
          zero_line=True, kinds=("kto",),
          help="Mean β·log π_θ/π_ref of the step's desirable and undesirable completions (a"
          " gap where the batch drew none of a side)."),
    Chart("ktokl", "KTO: reference point z₀", "job", "nats", y_range="zero", kinds=("kto",),
          help="max(0, mean log π_θ/π_ref of mismatched prompt-completion pairs): the paper's"
          " estimate of KL(π_θ ‖ π_ref), what each completion's reward is compared with."),
    Chart("ktoratio", "KTO: desirable weight ratio λ_D·n_D / (λ_U·n_U)", "job", "ratio",
          y_range="zero", kinds=("kto",),
          help="Of the step's batch. The paper advises [1, 4/3]: below 1, raise"
          " desirable_weight (or lower undesirable_weight); a gap where the batch drew no"
          " undesirable completion."),
    Chart("rmacc", "Reward model: pair accuracy", "job", "fraction of pairs", y_range="unit",
          kinds=("reward_model",), always=True, markers=True,
          help="Share of pairs the model scores chosen above rejected: the step's training"
          " pairs, and the held-out pairs at each evaluation (0.5: chance)."),
    Chart("rmmargin", "Reward model: margin r(chosen) − r(rejected)", "job", "score",
          zero_line=True, kinds=("reward_model",), markers=True,
          help="Mean score of the chosen answer less the rejected one's, on the step's training"
          " pairs and on the held-out pairs."),
    Chart("time", "Step time", "speed", "seconds (s)", y_range="zero", kinds=(),
          help="Wall-clock seconds per step, the part spent generating rollouts, and with tools"
          " what the calls held generation up and the sandbox's busy time."),
    Chart("throughput", "Throughput", "speed", "rollouts / s", y_range="zero"),
    Chart("syscpu", "Process CPU", "system", "% of one core", y_range="zero", kinds=(),
          x_axis="wall_time",
          help="CPU of the training process, mean over the samples since the step before (200%"
               " = two cores busy)."),
    Chart("sysmem", "Memory", "system", "GiB", y_range="zero", kinds=(), x_axis="wall_time",
          help="The training process's resident memory now and at its peak, and the memory"
               " the machine still has available."),
)  # fmt: skip

METRICS: tuple[Metric, ...] = (
    # separation
    Metric(SEP_POS_SCORE, "s⁺ positive",
           "Mean length-normalised log-prob of correct rollouts (valid groups).",
           SCORE, "scores", color="pos"),
    Metric(SEP_NEG_SCORE, "s⁻ negative",
           "Mean length-normalised log-prob of wrong rollouts (valid groups).",
           SCORE, "scores", color="neg"),
    Metric(SEP_GAP, "gap",
           "sep/pos_score − sep/neg_score: how far correct rollouts score above wrong ones.",
           SCORE, "gap", better="higher"),
    Metric(SEP_GAP_MIN, "gap_min (worst case)",
           "Worst case per group, min s⁺ − max s⁻; > 0 means every pair is ordered.",
           SCORE, "gap", better="higher", color="accent2"),
    Metric(SEP_ORDER_ACC, "order_acc",
           "Fraction of (correct, wrong) pairs in a group with s⁺ > s⁻.",
           "fraction", "acc", better="higher"),
    Metric(SEP_MARGIN_ACC, "margin_acc",
           "Fraction of (correct, wrong) pairs with s⁺ − m_t > s⁻.",
           "fraction", "acc", better="higher", color="accent2", dash=True),
    Metric(CONSPO_MARGIN, "m_t",
           "Margin m_t of the curriculum that sep/margin_acc and the softmax view use: a ConSPO"
           " run's own schedule; other runs use ConSPO's default schedule as a common reference.",
           SCORE, "margin", deterministic=True),
    Metric(CONSPO_P_POS, "p_pos",
           "Mean softmax probability P⁺ of each correct rollout against the group's wrong ones"
           " (at the run's τ; ConSPO's default τ for other objectives).",
           "probability", "ppos", better="higher"),
    Metric(CONSPO_P_POS_UNIFORM, "uniform 1/(1+N⁻)",
           "Reference for conspo/p_pos when scores carry no signal: 1/(1+N⁻).",
           "probability", "ppos", color="reference", dash=True),
    Metric(CONSPO_HARD_NEG_SHARE, "hard_neg_share",
           "Share of the push-down that goes to the highest-scoring wrong rollout (1/N⁻ = spread"
           " evenly, 1 = all on one).",
           "share", "hardneg", color="accent3"),
    Metric(GRPO_WEIGHT, "grpo/weight",
           "Mean sqrt(p̂(1−p̂)): GRPO's per-group weight on the score gap.",
           "weight", "grpo"),
    Metric(GRPO_CLIP_GAP, "grpo/clip_gap",
           "Gap of GRPO's clipped-ratio scores, mean s⁺_clip − mean s⁻_clip (0 while π_θ = π_old,"
           " i.e. with one optimiser pass per rollout batch).",
           "ratio", "grpo", color="accent2",
           constant_note="the clipped scores equal the plain ones: π_θ = π_old (on-policy, one"
           " optimiser update per rollout batch)"),
    # batch
    Metric(BATCH_PASS_RATE, "pass rate",
           "Fraction of all rollouts of the step that were verified correct.",
           "fraction", "reward", better="higher", color="pos"),
    Metric(BATCH_REWARD_LOST, "lost a reward",
           "Fraction of the step's rollouts on which a reward failed (it raised, hung past its"
           " timeout, or gave no finite number): each such reward scored 0 there, the first"
           " reason in the run's log. 0 when every reward scored every rollout.",
           "fraction", "reward", better="lower", color="neg", dash=True),
    Metric(BATCH_ALL_POS_GROUPS, "all correct",
           "Groups whose rollouts were all correct (no contrast).", "groups", "groups",
           color="pos"),
    Metric(BATCH_VALID_GROUPS, "mixed (valid)",
           "Groups with both correct and wrong rollouts (the ones that train).", "groups",
           "groups"),
    Metric(BATCH_ALL_NEG_GROUPS, "all wrong",
           "Groups whose rollouts were all wrong (no contrast).", "groups", "groups",
           color="neg"),
    Metric(BATCH_SHORTFALL_GROUPS, "shortfall",
           "Groups missing from sampling.prompts_per_step after the last refill round (dynamic"
           " sampling found too few mixed groups); 0 without refill_groups.", "groups", "refill",
           color="neg"),
    Metric(BATCH_REFILL_ROUNDS, "extra rounds",
           "Extra generation rounds dynamic sampling drew (at most params.max_refill_rounds).",
           "rounds", "refill", color="accent3", dash=True),
    # evaluation and lengths
    Metric(EVAL_ACCURACY, "accuracy (greedy)", "Greedy accuracy on the held-out split.",
           "fraction", "evalc", when="every eval.every steps, at the end and at step 0",
           better="higher"),
    Metric(EVAL_PASS_AT_K, "pass@k", "pass@k on the held-out split (k = eval.pass_k, sampled).",
           "fraction", "evalc", when="every eval.every steps, at the end and at step 0",
           better="higher", color="pos"),
    Metric(EVAL_PROBLEMS, "problems scored",
           "Distinct held-out problems each evaluation scored (the n of accuracy and pass@k):"
           " task.eval_size, or fewer where the task's held-out split has fewer.", "problems",
           None, when="every eval.every steps, at the end and at step 0", deterministic=True),
    # The model's own tokens: the length reward and the stored rollout sample count the same.
    Metric(LEN_POS, "len pos",
           "Mean response length of correct rollouts: the model's own tokens, EOS included (a"
           " tool's output is not counted).", "tokens", "len", color="pos"),
    Metric(LEN_NEG, "len neg",
           "Mean response length of wrong rollouts: the model's own tokens, EOS included (a"
           " tool's output is not counted).", "tokens", "len", color="neg"),
    Metric(LEN_TRUNCATED_FRAC, "truncated",
           "Fraction of the step's rollouts that hit sampling.max_new_tokens without an end"
           " token (the tokenizer's EOS or any the generation config declares).", "fraction",
           "truncated", better="lower", color="neg"),
    # optimisation
    Metric(LOSS, "loss",
           "Objective value being minimised (its meaning depends on the algorithm; mean over"
           " the step's mini-batches).",
           "loss", "loss", better="lower"),
    Metric(GRAD_NORM, "grad_norm", "Gradient norm before clipping (mean over mini-batches).",
           "norm", "gradnorm", color="accent2"),
    Metric(OPTIM_UPDATE_SIZE, "update size",
           "How far the step moved the policy: ‖θ_after − θ_before‖ / ‖θ_before‖ over the"
           " trainable parameters (LoRA: the adapters; a full fine-tune above 8M weights: every"
           " k-th tensor). Two objectives at one learning rate can differ in it many-fold: their"
           " effective step sizes, side by side.", "relative change", "updatesize",
           color="accent2"),
    Metric(ENTROPY, "entropy", "Mean per-token entropy of the policy on the sampled responses.",
           "nats / token", "entropy", color="accent3"),
    Metric(ENTROPY_POS, "entropy pos",
           "Mean per-token entropy of the policy on the correct rollouts (mean over the updates"
           " that had one).",
           "nats / token", "entropy", color="pos", dash=True),
    Metric(ENTROPY_NEG, "entropy neg",
           "Mean per-token entropy of the policy on the wrong rollouts (mean over the updates"
           " that had one).",
           "nats / token", "entropy", color="neg", dash=True),
    Metric(KL, "kl", "k3 estimate of KL(π_θ ‖ π_ref) per token.", "nats / token", "kl",
           when="a reference model is loaded (params.beta > 0)", better="lower", color="neg"),
    Metric(KL_IN_REWARD, "kl in reward",
           "Mean over the step's rollouts of Σ_t (log π_old − log π_ref) over the rollout's own"
           " tokens (the k1 estimate of the sequence's KL(π ‖ π_ref)); each reward lost"
           " params.kl_in_reward times it before the advantages.",
           "nats / rollout", "klreward", when="params.kl_in_reward > 0", better="lower",
           color="neg"),
    Metric(LR, "lr", "Learning rate used for this step (warmup, then constant).",
           "learning rate", "lr", deterministic=True, color="reference"),
    Metric(CLIP_FRAC, "clip_frac",
           "GRPO family and the clipped baselines (RLOO, REINFORCE++, GSPO, GMPO, CISPO, MCPO):"
           " fraction of response tokens whose ratio was clipped (0 while π_θ = π_old, i.e."
           " with optim.mini_batches = 1).",
           "fraction", "clipfrac", logged_by="objective", color="accent2",
           constant_note="no ratio was clipped: π_θ = π_old (on-policy, one optimiser update per"
           " rollout batch)"),
    Metric(PPO_VALUE_MEAN, "value V",
           "PPO: mean value the critic predicted, when the rollouts were scored, at its"
           " targets.", "return", "criticvalues", logged_by="objective", color="accent2"),
    Metric(PPO_RETURN_MEAN, "return R",
           "PPO: mean GAE return R = Â + V at the critic's targets (what it is regressed"
           " onto).", "return", "criticvalues", logged_by="objective", color="accent"),
    Metric(PPO_EXPLAINED_VAR, "explained variance",
           "PPO: 1 − Var(R − V)/Var(R) over the critic's targets, of the values the rollouts"
           " were scored with (NaN when the returns have no spread).", "fraction", "criticfit",
           logged_by="objective", better="higher"),
    Metric(PPO_VALUE_LOSS, "value loss",
           "PPO: the critic's loss ½·max((V − R)², (V_old + clip(V − V_old, ±ε_v) − R)²), token"
           " mean over its targets, averaged over its updates.", "loss", "criticloss",
           logged_by="objective", better="lower"),
    Metric(PPO_VALUE_CLIP_FRAC, "value clip frac",
           "PPO: share of the critic's targets where the clipped value term was the larger"
           " (0 on the first update of a batch: V = V_old).", "fraction", "criticloss",
           logged_by="objective", color="neg", dash=True,
           constant_note="one critic update per rollout batch (optim.mini_batches = optim.epochs"
           " = 1): V = V_old, so nothing is clipped"),
    Metric(PPO_ADV_STD, "advantage std",
           "PPO: std of the GAE token advantages over the model's tokens, before whitening.",
           "std", "advspread", logged_by="objective", color="accent3"),
    Metric(RRPO_ANCHOR_AUC, "anchor AUC",
           "RRPO: P(s(o⁺) > s(o⁻)) over the step's passed/failed pairs, s the score"
           " against the frozen anchors; NaN until the head is frozen or without both classes.",
           "AUC", "anchoragree", logged_by="objective", better="higher"),
    Metric(RRPO_ANCHOR_GAP, "anchor score gap",
           "RRPO: mean anchor score of the passed rollouts less the failed ones' (NaN until the"
           " head is frozen).", "score", "anchorgap", logged_by="objective"),
    Metric(RRPO_ANCHORS, "anchors",
           "RRPO: how many anchors (positives and negatives) the frozen head was trained on; 0"
           " while they are still collected.", "count", "anchorsets", logged_by="objective",
           color="accent3", smoothed=False),
    Metric(SAPO_GATE_WEIGHT, "gate weight",
           "SAPO: token-mean of the gate's gradient weight 4σ(1−σ)ρ (1 on-policy; smaller as"
           " ratios leave 1).",
           "weight", "gate", logged_by="objective", color="accent3"),
    Metric(DISCO_KL, "DisCO KL",
           "DisCO: k3 estimate of KL(π_old ‖ π_θ) per token over the mini-batch, the quantity"
           " its constraint holds below δ.",
           "nats / token", "oldkl", logged_by="objective", color="neg"),
    Metric(DISCO_CONSTRAINT_ACTIVE, "DisCO constraint",
           "DisCO: share of mini-batches whose KL exceeded δ (the squared hinge was active).",
           "fraction", "constraint", logged_by="objective", color="neg"),
    Metric(MCPO_KL_MASTERED, "MCPO KL (mastered)",
           "MCPO: mean k3 estimate of KL(π_old ‖ π_θ) per token on the rollouts of mastered"
           " (all-correct) groups (0 for a mini-batch without one; the step logs the mean over"
           " its mini-batches).",
           "nats / token", "oldkl", logged_by="objective", color="pos"),
    Metric(MCPO_HINGE_ACTIVE, "MCPO hinge",
           "MCPO: share of mastered-group rollouts whose KL exceeded δ (the hinge was active;"
           " 0 for a mini-batch without a mastered group).",
           "fraction", "constraint", logged_by="objective", color="pos"),
    Metric(ISPO_HINGE_ACTIVE, "ISPO hinge",
           "ISPO (designed from the abstract): share of the wrong rollouts' decision tokens"
           " (highest entropy) chosen with probability above c, the ones the hinge pushes down.",
           "fraction", "constraint", logged_by="objective", color="neg", dash=True),
    Metric(OPTIM_UPDATES, "updates",
           "Optimiser steps taken this step: one per (epoch, mini-batch) whose gradient is not"
           " exactly zero.", "optimiser steps", "updates", color="accent", deterministic=True,
           constant_note="optim.epochs × optim.mini_batches every step"),
    Metric(OPTIM_SKIPPED, "skipped",
           "1 when the step took no optimiser step (no group carried signal): weights, AdamW's"
           " moments and the learning-rate schedule did not move.", "flag", "updates",
           color="neg", dash=True, deterministic=True),
    Metric(OPTIM_BACKWARD_SKIPPED, "backward skipped",
           "Share of the step's updates known to have no gradient before any forward (an"
           " objective linear on policy, β = 0, every group's rewards equal): their log-probs"
           " ran without grad (scores and entropy recorded as ever) and no backward ran.",
           "fraction", "updates", color="accent2", dash=True, deterministic=True),
    # off-policy
    Metric(OFFPOLICY_RATIO_MEAN, "ratio mean",
           "Mean importance ratio ρ = π_θ/π_old over response tokens (mean over the updates).",
           "ratio", "ratio", constant_note=ON_POLICY),
    Metric(OFFPOLICY_RATIO_MAX, "ratio max", "Largest token ratio over the step's updates.",
           "ratio", "ratio", color="pos", dash=True, constant_note=ON_POLICY),
    Metric(OFFPOLICY_RATIO_MIN, "ratio min", "Smallest token ratio over the step's updates.",
           "ratio", "ratio", color="neg", dash=True, constant_note=ON_POLICY),
    Metric(OFFPOLICY_CLIP_LOW, "below 1 − ε_low",
           "Fraction of response tokens with ρ < 1 − ε_low (mean over the updates).",
           "fraction", "clipside", color="neg", constant_note=ON_POLICY),
    Metric(OFFPOLICY_CLIP_HIGH, "above 1 + ε_high",
           "Fraction of response tokens with ρ > 1 + ε_high (mean over the updates).",
           "fraction", "clipside", color="pos", constant_note=ON_POLICY),
    # sampler against trainer
    Metric(MISMATCH_LOGP_DIFF_MEAN, "mean |Δ log p|",
           "Mean |log π_old − log μ| over the model's tokens of the step (μ: the probability the"
           " engine sampled each token with).", "nats", "mismatchlogp", when=MISMATCH_WHEN,
           better="lower"),
    Metric(MISMATCH_LOGP_DIFF_MAX, "max |Δ log p|", "Largest |log π_old − log μ| of a token.",
           "nats", "mismatchlogp", when=MISMATCH_WHEN, color="neg", dash=True, better="lower"),
    Metric(MISMATCH_KL, "KL(μ ‖ π_old)",
           "KL from the sampler to the trainer per token: the k3 estimate e^x − x − 1,"
           " x = log π_old − log μ, on the sampled tokens.", "nats / token", "mismatchkl",
           when=MISMATCH_WHEN, better="lower"),
    Metric(MISMATCH_WEIGHT_MEAN, "mean weight",
           "Mean importance weight the correction gives a token (token modes) or a rollout"
           " (sequence modes): π_old/μ after the cap; 1 when sampling.mismatch_correction is"
           " off.", "weight", "mismatchweight", when=MISMATCH_WHEN),
    Metric(MISMATCH_CORRECTED_FRAC, "past the cap",
           "Share of tokens (token modes, and off) or rollouts (sequence modes) whose π_old/μ"
           " exceeds the cap C: truncated to C or masked out; with the correction off, the share"
           " that would be.", "fraction", "mismatchweight", when=MISMATCH_WHEN, color="neg",
           dash=True, better="lower"),
    # asynchronous generation
    Metric(ASYNC_POLICY_LAG, "policy lag",
           "Updates between the weights that sampled the step's rollouts and the trainer's"
           " π_old: step s is sampled by the weights after update s − 1 − k.", "updates",
           "asynclag", when="sampling.max_staleness ≥ 1", deterministic=True, smoothed=False),
    Metric(ASYNC_TRAINER_WAIT_S, "trainer waited",
           "Seconds the trainer waited for the step's rollouts.", "s", "asyncwait",
           when="sampling.max_staleness ≥ 1", better="lower"),
    Metric(ASYNC_GENERATOR_IDLE_S, "generator idle",
           "Seconds the generating thread waited, its last batch done, before this step's"
           " batch was asked for.", "s", "asyncwait", when="sampling.max_staleness ≥ 1",
           color="accent2", dash=True),
    # tools
    Metric(TOOLS_CALLS, "calls", "Mean tool calls per rollout of the step.", "calls",
           "toolcalls", when="the run has tools (tools.names)"),
    Metric(TOOLS_CALLS_POS, "calls (correct)", "Mean tool calls of the correct rollouts.",
           "calls", "toolcalls", when="the run has tools (tools.names)", color="pos",
           dash=True),
    Metric(TOOLS_CALLS_NEG, "calls (wrong)", "Mean tool calls of the wrong rollouts.", "calls",
           "toolcalls", when="the run has tools (tools.names)", color="neg", dash=True),
    Metric(TOOLS_ACC_WITH_CALL, "pass rate, called",
           "Pass rate of the rollouts that called a tool at least once (NaN: none did).",
           "fraction", "toolpay", when="the run has tools (tools.names)", color="pos"),
    Metric(TOOLS_ACC_WITHOUT_CALL, "pass rate, no call",
           "Pass rate of the rollouts that called no tool (NaN: every one did).", "fraction",
           "toolpay", when="the run has tools (tools.names)", color="neg"),
    Metric(TOOLS_CALL_RATE, "share calling",
           "Share of the step's rollouts that called a tool at least once.", "fraction",
           "toolpay", when="the run has tools (tools.names)", color="accent3", dash=True),
    Metric(TOOLS_OK_RATE, "ok", "Share of the step's calls that ran to the end (NaN: no call).",
           "fraction", "toolstatus", when="the run has tools (tools.names)", better="higher",
           color="pos"),
    Metric(TOOLS_ERROR_RATE, "error",
           "Share of the step's calls that failed: an exception, a non-zero exit, a killed"
           " process (NaN: no call).", "fraction", "toolstatus",
           when="the run has tools (tools.names)", better="lower", color="neg"),
    Metric(TOOLS_TIMEOUT_RATE, "timeout",
           "Share of the step's calls killed at tools.timeout_s (NaN: no call).", "fraction",
           "toolstatus", when="the run has tools (tools.names)", better="lower",
           color="accent3"),
    Metric(TOOLS_TURNS, "turns", "Mean model turns per rollout: its calls + 1.", "turns",
           "tooltokens", when="the run has tools (tools.names)"),
    Metric(TOOLS_OBSERVATION_TOKENS, "interpreter tokens",
           "Mean interpreter tokens per rollout (masked out of every loss and score; they count"
           " against sampling.max_new_tokens).", "tokens", "tooltokens",
           when="the run has tools (tools.names)", color="accent2"),
    Metric(EVAL_ENV_TURNS, "turns (held-out, greedy)",
           "Mean turns of the held-out games' greedy episodes (eval/accuracy is their success"
           " rate).", "turns", "envturns", when="the run plays an environment, at every"
           " evaluation", color="accent3", dash=True),
    Metric(EVAL_TOOL_CALL_RATE, "tool-call rate (greedy)",
           "Share of the held-out problems whose greedy answer called a tool.", "fraction",
           "evalc", when="the run has tools, at every evaluation", color="accent3", dash=True),
    # proxy vs truth
    Metric(PROXY_REWARD, "proxy (trained on)",
           "Mean shaped reward Σ weight · reward of the step's rollouts: what the objective"
           " trains on (before any KL in the reward).", "reward", "proxytruth",
           when="a reward besides the truth has a weight"),
    Metric(PROXY_TRUTH, "truth",
           "Mean of the truth reward (config truth; the verifier by default) over the step's"
           " rollouts.", "reward", "proxytruth", when="a reward besides the truth has a weight",
           better="higher", color="pos"),
    Metric(PROXY_GAP, "gap (proxy − truth)",
           "proxy/reward − proxy/truth: widening while the truth stalls is over-optimisation.",
           "reward", "proxytruth", when="a reward besides the truth has a weight",
           color="neg", dash=True),
    Metric(PROXY_AGREEMENT, "pair agreement",
           "Of the pairs of rollouts of one prompt whose truth differs, the share the proxy"
           " orders the same way (a tie counts half; 0.5 is chance). NaN: no such pair.",
           "fraction", "proxyrank", when="a reward besides the truth has a weight",
           better="higher"),
    Metric(PROXY_SPEARMAN, "Spearman ρ",
           "Spearman's rank correlation of the proxy and the truth over the step's rollouts"
           " (ties at their mean rank). NaN: either is constant.", "ρ", "proxyrank",
           when="a reward besides the truth has a weight", better="higher", color="accent2"),
    Metric(EVAL_BEST_OF_N, "best-of-N",
           "Share of held-out problems whose eval.pass_k samples' pick by the eval.best_of"
           " reward (its highest-scored) is verified correct.", "fraction", "bestofn",
           when="eval.best_of is set, at every evaluation", better="higher", color="pos"),
    Metric(EVAL_SAMPLE_ACCURACY, "one sample (pass@1)",
           "Share of the held-out pass@k samples verified correct: the expected accuracy of"
           " one sample at eval.temperature, what best-of-N improves on.", "fraction",
           "bestofn", when="eval.best_of is set, at every evaluation", better="higher",
           color="reference", dash=True),
    Metric(EVAL_PROXY_REWARD, "proxy (held-out)",
           "Mean shaped reward of the held-out pass@k samples (eval.pass_k per problem, at"
           " eval.temperature).", "reward", "proxytruth", when="a reward besides the truth has"
           " a weight, at every evaluation", dash=True),
    Metric(EVAL_PROXY_TRUTH, "truth (held-out)",
           "Mean truth reward of the held-out pass@k samples (with the verifier as the truth:"
           " their pass rate).", "reward", "proxytruth", when="a reward besides the truth has"
           " a weight, at every evaluation", better="higher", color="pos", dash=True),
    Metric(EVAL_PROXY_AGREEMENT, "pair agreement (held-out)",
           "The pair agreement on the held-out pass@k samples, a problem's samples as its group"
           " (NaN with eval.pass_k = 1: no pairs).", "fraction", "proxyrank",
           when="a reward besides the truth has a weight, at every evaluation", better="higher",
           dash=True),
    Metric(EVAL_PROXY_SPEARMAN, "Spearman ρ (held-out)",
           "Spearman's ρ of proxy and truth over the held-out pass@k samples.", "ρ", "proxyrank",
           when="a reward besides the truth has a weight, at every evaluation", better="higher",
           color="accent2", dash=True),
    # environments
    Metric(ENV_TURNS, "turns", "Mean turns (actions played) per episode of the step.",
           "turns", "envturns", when="the run plays an environment"),
    Metric(ENV_TURNS_POS, "turns (won)", "Mean turns of the won episodes (NaN: none won).",
           "turns", "envturns", when="the run plays an environment", color="pos", dash=True),
    Metric(ENV_TURNS_NEG, "turns (lost)", "Mean turns of the lost episodes (NaN: all won).",
           "turns", "envturns", when="the run plays an environment", color="neg", dash=True),
    Metric(ENV_SUCCESS, "won", "Share of the step's episodes won (their rollouts verified"
           " correct).", "fraction", "envoutcome", when="the run plays an environment",
           better="higher", color="pos"),
    Metric(ENV_FAILED, "environment failed",
           "Share of episodes the environment failed: it raised, hung past"
           " environment.timeout_s, or returned a wrong type or a non-finite reward.",
           "fraction", "envoutcome", when="the run plays an environment", better="lower",
           color="neg"),
    Metric(ENV_TRUNCATED, "cut", "Share of episodes cut before the environment said done: at"
           " environment.max_turns or sampling.max_new_tokens.", "fraction", "envoutcome",
           when="the run plays an environment", color="accent3", dash=True),
    Metric(ENV_INVALID, "invalid turns", "Share of the step's turns the environment marked"
           " invalid (info['invalid']: no move found, a move against the rules; NaN: no turn).",
           "fraction", "envoutcome", when="the run plays an environment", better="lower",
           color="accent2", dash=True),
    Metric(ENV_RETURN, "return", "Mean return of an episode: the environment's final reward,"
           " else the sum of its turn rewards (0 for a failed one).", "reward", "envreward",
           when="the run plays an environment", better="higher"),
    Metric(ENV_TURN_REWARD, "per turn", "Mean reward of one turn (NaN: no turn).", "reward",
           "envreward", when="the run plays an environment", color="accent2", dash=True),
    Metric(ENV_OBSERVATION_TOKENS, "observation tokens",
           "Mean environment tokens per rollout (its turns' text: masked out of every loss and"
           " score, counted against sampling.max_new_tokens).", "tokens", "envtokens",
           when="the run plays an environment"),
    # job kinds other than rl
    Metric(SFT_TOKEN_ACC, "token accuracy",
           "SFT: share of the target's tokens (answer + EOS; a tool trace's interpreter output"
           " excluded) that are the model's argmax under teacher forcing.", "fraction", "sft",
           logged_by="objective", better="higher"),
    Metric(RFT_ACCEPTED, "accepted",
           "Rejection sampling: share of the round's sampled answers whose accept reward is"
           " above the threshold (before deduplication and the per-prompt cap); logged at the"
           " round's first step.", "fraction", "rftaccept", logged_by="objective",
           when="a round's first step", better="higher"),
    Metric(RFT_PROMPTS_KEPT, "prompts with a kept answer",
           "Rejection sampling: share of the round's prompts with at least one kept answer.",
           "fraction", "rftaccept", logged_by="objective", when="a round's first step",
           better="higher", color="accent2"),
    Metric(RFT_KEPT, "kept this round",
           "Rejection sampling: answers the round kept (passed, distinct per prompt, at most"
           " max_per_prompt each).", "answers", "rftkept", logged_by="objective",
           when="a round's first step"),
    Metric(RFT_POOL, "pool",
           "Rejection sampling: answers the step's SFT batch was drawn from (every round's so"
           " far, or the latest round's: kind_params.pool).", "answers", "rftkept",
           logged_by="objective", color="accent2"),
    Metric(SFT_TOKENS, "answer tokens",
           "SFT: target tokens the step's loss averaged over (prompt, padding and the"
           " interpreter's output inside tool traces excluded).",
           "tokens", "sfttokens", logged_by="objective"),
    Metric(DISTILL_REVERSE_KL, "reverse KL",
           "Distillation: mean over the student's response tokens of KL(π_θ ‖ π_teacher) over"
           " the vocabulary (the loss).", "nats / token", "distill", logged_by="objective",
           better="lower"),
    Metric(DISTILL_TEACHER_LOGPROB, "teacher log-prob",
           "Distillation: mean teacher log-prob of the tokens the student sampled (higher: the"
           " teacher would have said so too).", SCORE, "distilllp", logged_by="objective",
           better="higher"),
    Metric(DISTILL_LENGTH, "length", "Distillation: mean length of the student's samples.",
           "tokens", "distilllen", logged_by="objective"),
    Metric(DPO_ACCURACY, "pair accuracy",
           "DPO: share of pairs with β·log π_θ/π_ref higher for chosen than for rejected.",
           "fraction", "dpoacc", logged_by="objective", better="higher"),
    Metric(DPO_MARGIN, "margin", "DPO: mean chosen − rejected implicit reward.", "reward",
           "dporeward", logged_by="objective", better="higher"),
    Metric(DPO_CHOSEN, "chosen", "DPO: mean implicit reward β·log π_θ/π_ref of chosen answers.",
           "reward", "dporeward", logged_by="objective", color="pos"),
    Metric(DPO_REJECTED, "rejected",
           "DPO: mean implicit reward β·log π_θ/π_ref of rejected answers.", "reward",
           "dporeward", logged_by="objective", color="neg"),
    Metric(KTO_ACCURACY, "on their side of z₀",
           "KTO: share of the step's completions with log π_θ/π_ref above the reference point"
           " z₀ if desirable, below it if undesirable.", "fraction", "ktoacc",
           logged_by="objective", better="higher"),
    Metric(KTO_REWARD_DESIRABLE, "desirable",
           "KTO: mean implicit reward β·log π_θ/π_ref of the step's desirable completions (NaN,"
           " a gap, when it drew none).", "reward", "ktoreward", logged_by="objective",
           color="pos"),
    Metric(KTO_REWARD_UNDESIRABLE, "undesirable",
           "KTO: mean implicit reward β·log π_θ/π_ref of the step's undesirable completions"
           " (NaN, a gap, when it drew none).", "reward", "ktoreward", logged_by="objective",
           color="neg"),
    Metric(KTO_KL, "z₀",
           "KTO: the reference point, max(0, mean log π_θ/π_ref over the batch's prompts each"
           " with another example's completion), detached: the KL estimate.", "nats", "ktokl",
           logged_by="objective"),
    Metric(KTO_WEIGHT_RATIO, "λ_D·n_D / (λ_U·n_U)",
           "KTO: the step's desirable weight against its undesirable weight (n: the batch's"
           " count of each); the paper advises [1, 4/3]. Inf (a gap) when the batch drew no"
           " undesirable completion.", "ratio", "ktoratio", logged_by="objective"),
    Metric(RM_ACCURACY, "pair accuracy (train)",
           "Reward model: share of the step's training pairs scored chosen above rejected.",
           "fraction", "rmacc", logged_by="objective", better="higher"),
    Metric(EVAL_RM_ACCURACY, "pair accuracy (held-out)",
           "Reward model: share of the held-out pairs (kind_params.eval_fraction of the"
           " prompts, never trained on) scored chosen above rejected.", "fraction", "rmacc",
           logged_by="objective", when="steps with the held-out evaluation", better="higher",
           color="accent2"),
    Metric(RM_MARGIN, "margin (train)",
           "Reward model: mean r(chosen) − r(rejected) over the step's training pairs (the"
           " Bradley–Terry loss is −log σ of it).", "score", "rmmargin", logged_by="objective",
           better="higher"),
    Metric(EVAL_RM_MARGIN, "margin (held-out)",
           "Reward model: mean r(chosen) − r(rejected) over the held-out pairs.", "score",
           "rmmargin", logged_by="objective", when="steps with the held-out evaluation",
           better="higher", color="accent2"),
    # speed
    Metric(TIME_STEP_S, "step", "Wall-clock seconds of the whole step.", "s", "time",
           better="lower"),
    Metric(TIME_ROLLOUT_S, "rollout", "Wall-clock seconds spent generating rollouts.", "s",
           "time", better="lower", color="accent3"),
    Metric(TIME_EVAL_S, "evaluation",
           "Wall-clock seconds of the held-out evaluation (benchmarks included), apart from the"
           " step's time: the ETA adds one per evaluation still to come.", "s", "time",
           when="steps with the held-out evaluation", better="lower", color="accent2",
           dash=True),
    Metric(TIME_TOOLS_S, "waiting for tools",
           "Wall-clock seconds of the step's generation in which every unfinished rollout"
           " waited for its tool call (calls also run while other rollouts write: this is what"
           " they added to the rollout time).", "s", "time", when="the run has tools",
           better="lower", color="accent2"),
    Metric(TIME_ENV_S, "environment steps",
           "Seconds the step's environment calls took, added up over its episodes (they run"
           " while other rollouts write).", "s", "time", when="the run plays an environment",
           better="lower", color="accent3", dash=True),
    Metric(TIME_SANDBOX_S, "tool calls",
           "Seconds the step's tool calls ran, added up (sandbox start included): the"
           " sandbox's busy time. Calls run beside generation and each other, so this can exceed"
           " the rollout time; time/tools_s is what they held generation up.", "s", "time",
           when="the run has tools", better="lower", color="accent3", dash=True),
    Metric(THROUGHPUT_ROLLOUTS_PER_S, "rollouts/s", "Rollouts generated per second of step time.",
           "rollouts / s", "throughput", better="higher"),
    Metric(ROLLOUTS_SEEN, "rollouts seen", "Rollouts generated since the start of the run.",
           "rollouts", None, deterministic=True),
    # system (conspo.system)
    Metric(SYS_CPU_PERCENT, "process CPU",
           "CPU of the training process in % of one core, mean over the samples (every few"
           " seconds) since the step before.", "%", "syscpu", when="steps a sample fell in",
           smoothed=False),
    Metric(SYS_RSS_GIB, "resident", "The training process's resident memory at the last sample.",
           "GiB", "sysmem", when="steps a sample fell in", smoothed=False),
    Metric(SYS_PEAK_RSS_GIB, "peak resident",
           "The training process's resident high-water mark since the run started (VmHWM).",
           "GiB", "sysmem", when="steps a sample fell in", color="neg", dash=True,
           smoothed=False),
    Metric(SYS_AVAILABLE_GIB, "machine available",
           "Memory the machine still had available (the lowest sample since the step before).",
           "GiB", "sysmem", when="steps a sample fell in", color="accent3", smoothed=False),
)  # fmt: skip


# Per-GPU readings (conspo.system, through NVML): one key per GPU of the run and reading.
GPU_PATTERNS: tuple[MetricPattern, ...] = tuple(
    MetricPattern(
        f"system/gpu<i>/{reading}", rf"^system/gpu\d+/{reading}$", label, text, unit,
        when="CUDA runs whose worker reads NVML, steps a sample fell in", section="gpu",
        y_range="zero", smoothed=False, x_axis="wall_time",
    )
    for reading, label, text, unit in (
        ("util", "GPU utilisation", "Share of the time a kernel ran (NVML), mean of the samples.",
         "%"),
        ("mem_gib", "GPU memory used", "Device memory in use, every process (NVML), the highest"
         " sample.", "GiB"),
        ("mem_total_gib", "GPU memory total", "The device's memory (NVML).", "GiB"),
        ("power_w", "GPU power", "Board power draw (NVML), mean of the samples.", "W"),
        ("temp_c", "GPU temperature", "Core temperature (NVML), the highest sample.", "°C"),
    )
)  # fmt: skip


# Benchmark keys (conspo.evaluation): one pair per entry of eval.benchmarks, k in the name.
BENCHMARK_PATTERNS: tuple[MetricPattern, ...] = (
    MetricPattern(
        "eval/<benchmark>/avg@<k>", r"^eval/[A-Za-z0-9][\w.-]*/avg@\d+$", "avg@k",
        "Mean correctness over k samples per problem of the benchmark (eval.temperature,"
        " eval.top_p): the paper's avg@k.",
        "fraction", when="every eval.every steps, at the end and at step 0 (eval.at_start)",
        better="higher", y_range="unit",
    ),
    MetricPattern(
        "eval/<benchmark>/pass@<k>", r"^eval/[A-Za-z0-9][\w.-]*/pass@\d+$", "pass@k",
        "Unbiased pass@k over the benchmark's problems from its k samples each: the fraction of"
        " problems with a correct sample.",
        "fraction", when="every eval.every steps, at the end and at step 0 (eval.at_start)",
        better="higher", y_range="unit",
    ),
)  # fmt: skip


# Reward keys (conspo.rewards): one per reward function in the run's config.rewards.
REWARD_PATTERNS: tuple[MetricPattern, ...] = (
    MetricPattern(
        "reward/<name>", r"^reward/[\w.-]+$", "reward",
        "Mean over the step's training rollouts of one reward function of config.rewards,"
        " before its weight (reward/verifier: the verified outcome, i.e. the pass rate; the"
        " objective sees Σ weight · reward).",
        "reward", when="every step, one key per configured reward", section="batch",
        same_as={"reward/verifier": BATCH_PASS_RATE},
    ),
)  # fmt: skip

PATTERNS: tuple[MetricPattern, ...] = BENCHMARK_PATTERNS + REWARD_PATTERNS + GPU_PATTERNS


@cache
def catalogue() -> Catalogue:
    """The whole catalogue as one value (what the API serves and the pages render)."""
    # they import this module
    from conspo.registry import get_job_kind, get_objective, job_kind_names, objective_names

    return Catalogue(
        sections=list(SECTIONS),
        charts=list(CHARTS),
        metrics=list(METRICS),
        key_metrics=list(KEY_METRICS),
        rollouts_axis=ROLLOUTS_SEEN,
        step_time=TIME_STEP_S,
        eval_problems=EVAL_PROBLEMS,
        eval_accuracy=EVAL_ACCURACY,
        objective_metrics={a: list(get_objective(a).metrics) for a in objective_names()},
        kind_metrics={k: list(get_job_kind(k).metrics) for k in job_kind_names()},
        legacy_keys=dict(LEGACY_KEYS),
        patterns=list(PATTERNS),
        charted_keys=[
            m.key
            for section in SECTIONS
            for chart in CHARTS
            if chart.section == section.id
            for m in METRICS
            if m.chart == chart.id
        ],
    )


def metric(key: str) -> Metric | None:
    """The catalogue entry of ``key``, or None for a key logged from elsewhere."""
    return _BY_KEY.get(key)


def bounds(key: str) -> tuple[float, float] | None:
    """The range ``key``'s values cannot leave: (0, 1) for a fraction (a key drawn on a panel,
    or described by a pattern, whose y_range is "unit"); None for an unbounded key. Intervals
    of a mean of fractions are cut to it."""
    entry = metric(key)
    if entry is not None:
        chart = _CHART_BY_ID.get(entry.chart or "")
        return (0.0, 1.0) if chart is not None and chart.y_range == "unit" else None
    family = pattern(key)
    return (0.0, 1.0) if family is not None and family.y_range == "unit" else None


def benchmark_keys(name: str, k: int) -> tuple[str, str]:
    """(avg@k key, pass@k key) of the benchmark ``name`` scored with ``k`` samples per problem."""
    return f"eval/{name}/avg@{k}", f"eval/{name}/pass@{k}"


def reward_key(name: str) -> str:
    """The key of the reward function ``name`` (conspo.rewards)."""
    return f"reward/{name}"


def pattern(key: str) -> MetricPattern | None:
    """The pattern entry that describes ``key`` (a benchmark or reward key), if any."""
    return next((p for p in PATTERNS if re.match(p.regex, key)), None)


_BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}
_CHART_BY_ID: dict[str, Chart] = {c.id: c for c in CHARTS}
