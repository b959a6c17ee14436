"""The RLVR step: prompts → rollouts → rewards → log-probs → objective → update → log.

    result = train(RunConfig.from_file("run.yaml"), JsonlSink("out/metrics.jsonl"),
                   workdir="out", model_store=builtin_store())

``train`` is the one training loop (``conspo.training.loop.run_loop``: setup, resume,
checkpoints, evaluation, cancellation) around ``train_step``.

One step samples ``prompts_per_step`` groups of ``group_size`` rollouts, rewards them (the
configured reward functions, ``conspo.rewards``: the verifier's outcome decides who is positive,
their weighted sum is the reward the objective sees), scores them under the current policy, and
takes ``optim.epochs × optim.mini_batches`` optimiser steps on the registered objective
(``conspo.registry``), each on a mini-batch of whole groups; an update
whose gradient is exactly zero (no group carries signal) takes no optimiser step, and a step that
took none does not tick the learning-rate schedule (``optim/skipped``). The loop never branches
on the algorithm: the objective is a function of a ``PolicyBatch`` and its params, and what the
§4 separation statistics need of the algorithm (τ, m_t, ε) comes from ``params.separation_view``.
The step's three concerns live beside this module: ``rollouts`` (sample, verify and reward
groups, refill rounds), ``update`` (the optimiser steps: mini-batches, micro-batches, the one
backward routine, reference log-probs) and ``records`` (what the sink receives); the training
log-probs are ``logprobs``.
All randomness of a step (prompts, sampling, mini-batch order, evaluation) is a function of
(seed, step), so a run resumed from a checkpoint reproduces the uninterrupted run exactly on CPU.

Inside a ``torch.distributed`` process group (``conspo.distributed.collectives``: its local
launcher, or Ray Train) the same loop runs on every rank: each samples and differentiates its own
whole groups, every rank sees the whole batch's rollouts and the objective's whole mini-batch,
gradients are summed, and rank 0 alone logs, checkpoints and evaluates. Without a group nothing
changes.

Shapes: N = groups × G rollouts, P prompt positions, T response positions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from conspo import metrics as M
from conspo.access import DataFiles
from conspo.config import RunConfig
from conspo.models.store import ModelStore
from conspo.sink import Sink, StepRecord
from conspo.training.loop import (
    LoopStep,
    TrainResult,
    TrainState,
    eval_due,
    lr_at,
    run_eval,
    run_loop,
)
from conspo.training.pipeline import RolloutPipeline
from conspo.training.records import make_record
from conspo.training.rollouts import collect_rollouts
from conspo.training.stats import environment_stats, proxy_stats, tool_stats
from conspo.training.update import update


def train(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    model_store: ModelStore | None = None,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
) -> TrainResult:
    """Train ``config`` to ``config.steps``, resuming from ``workdir``'s latest checkpoint: the
    one loop (``conspo.training.loop.run_loop``: its arguments) around ``train_step``."""
    return run_loop(
        config,
        sink,
        should_stop,
        workdir=workdir,
        start=lambda state, files, store: training_steps(state),
        model_store=model_store,
        files=files,
        memory_limit=memory_limit,
    )


def train_step(
    state: TrainState,
    step: int,
    should_stop: Callable[[], bool],
    pipeline: RolloutPipeline | None = None,
) -> StepRecord | None:
    """One step; None when should_stop() fired while rollouts were drawn (nothing was updated).
    With ``pipeline`` the rollouts are its (generated while earlier steps trained), and the
    updated weights are published to it instead of synced to the engine."""
    cfg = state.cfg
    t0 = time.perf_counter()
    floats: dict[str, float] = {}
    if pipeline is not None:
        generated, waited = pipeline.take(step, should_stop)
        rollouts = generated.rollouts
        floats = {
            M.ASYNC_POLICY_LAG: float(step - 1 - generated.version),
            M.ASYNC_TRAINER_WAIT_S: waited,
            M.ASYNC_GENERATOR_IDLE_S: generated.idle_s,
        }
    else:
        with state.precision.autocast():
            rollouts = collect_rollouts(state, step, should_stop)
    if rollouts is None:
        return None
    t_rollout = time.perf_counter() - t0
    lr = lr_at(cfg, state.trained_steps + 1)  # the schedule ticks only on steps that updated
    stats, scores, updates = update(state, rollouts, step, lr)
    state.trained_steps += int(updates > 0)
    if pipeline is not None:
        pipeline.publish(step, state.model)
    else:
        state.engine.sync(state.model)
    t_step = time.perf_counter() - t0
    state.rollouts_seen += rollouts.generated
    floats |= {
        M.TIME_STEP_S: t_step,
        M.TIME_ROLLOUT_S: t_rollout,
        M.THROUGHPUT_ROLLOUTS_PER_S: rollouts.generated / t_step,
        M.ROLLOUTS_SEEN: float(state.rollouts_seen),
        M.LR: lr,
        M.OPTIM_UPDATES: float(updates),
        M.OPTIM_SKIPPED: float(updates == 0),
        M.BATCH_SHORTFALL_GROUPS: float(rollouts.shortfall),
        M.BATCH_REFILL_ROUNDS: float(rollouts.refill_rounds),
        **{M.reward_key(k): float(v.mean()) for k, v in rollouts.reward_parts.items()},
    }
    if rollouts.reward_lost is not None:
        floats[M.BATCH_REWARD_LOST] = float(rollouts.reward_lost.float().mean())
    if rollouts.batch.tool_calls is not None:
        floats[M.TIME_TOOLS_S] = rollouts.batch.tool_seconds
        floats.update(tool_stats(rollouts.batch.tool_calls, rollouts.correct.tolist()))
    if (batch := rollouts.batch).episodes is not None:
        observed = (batch.lengths - batch.model_lengths).tolist()
        floats.update(environment_stats(batch.episodes, rollouts.correct.tolist(), observed))
    if cfg.proxy_rewards():  # the shaped reward is not the truth: set one against the other
        truth = rollouts.reward_parts[cfg.truth].tolist()
        floats.update(proxy_stats(rollouts.rewards.tolist(), truth, rollouts.group_ids.tolist()))
    if eval_due(cfg, step):
        if pipeline is None:
            floats.update(run_eval(state, step))
        else:  # the engine between two batches, with the trainer's weights
            with pipeline.engine_for(state.model):
                floats.update(run_eval(state, step))
    return make_record(state, step, stats, floats, rollouts, scores)


def training_steps(state: TrainState) -> LoopStep:
    """The loop's step: ``train_step``, with the run's asynchronous generation
    (``sampling.max_staleness``) started at the first step it runs (after a resume: from the
    checkpoint's weights) and closed with the run (``TrainState.closers``)."""
    started: list[RolloutPipeline] = []

    def step(n: int, should_stop: Callable[[], bool]) -> StepRecord | None:
        if state.cfg.sampling.max_staleness and not started:
            started.append(RolloutPipeline(state, n, state.cfg.sampling.max_staleness))
            state.closers.append(started[0].close)
        return train_step(state, n, should_stop, started[0] if started else None)

    return step
