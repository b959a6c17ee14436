"""The one training loop every job kind runs inside: setup, resume, the step-0 evaluation,
steps, checkpoints, the best model, cancellation and the finish events.

    result = run_loop(config, sink, should_stop, workdir="out", start=my_start)

``start(state, files, store)`` is called once, after the policy is built and before a checkpoint
is loaded (what it copies is the starting policy), and returns the kind's step
``step(n, should_stop) -> StepRecord | None``; None means ``should_stop`` fired inside the step and
nothing was updated. The RL trainer's step is ``conspo.training.trainer.train_step``; a kind that
takes one optimiser update per step and returns its metrics wraps its step in
``one_update_per_step``, which adds the learning rate, the step time and the held-out evaluation
when due, so an SFT run's final eval and the RL run chained after it are measured alike.

Checkpoints are written every ``checkpoint.every`` steps, at the end and at a cancel, after a
flush of the sink, so a resumed run continues from its last checkpoint and re-logs nothing before
it; everything random in a step is a function of (seed, step) (``step_seed``). Inside a
``torch.distributed`` process group (``conspo.distributed``) every rank runs this loop: rank 0
alone logs, checkpoints and evaluates, and ``agreed`` makes its answer to ``should_stop``
everyone's, so all ranks stop at the same step boundary.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from conspo import metrics as M
from conspo import stopping
from conspo.access import DataFiles
from conspo.config import RunConfig
from conspo.distributed import collectives as distributed
from conspo.environments.base import Simulator
from conspo.environments.runner import EnvironmentLimits
from conspo.evaluation import (
    Benchmark,
    HeldOutProxy,
    best_so_far,
    evaluate,
    improves,
    load_benchmarks,
    rendered,
    save_best,
    score_benchmark,
)
from conspo.generation.batch import Engine, RolloutBatch
from conspo.generation.engines import make_engine
from conspo.generation.simulator import ModelSimulator
from conspo.generation.tool_rollout import EnvironmentPlay, ToolEngine, ToolUse, turn_format
from conspo.models.builtins import builtin_store
from conspo.models.loading import (
    describe_device,
    device_memory,
    load_pretrained,
    model_dims,
    pick_device,
    prepare_for_training,
)
from conspo.models.precision import Precision, make_precision
from conspo.models.resources import (
    MemoryEstimate,
    OutOfMemory,
    check_budget,
    check_memory,
    estimate_memory,
    out_of_memory_message,
)
from conspo.models.scoring import ModelScorers, load_reward_models
from conspo.models.store import ModelStore
from conspo.objectives.base import ObjectiveParams, sequence_scores
from conspo.objectives.ppo import PPOParams
from conspo.registry import get_environment, get_job_kind, get_objective
from conspo.rewards import WeightedReward, build_rewards
from conspo.rewards.base import VERIFIER, RewardContext, score_rollouts
from conspo.sandbox import require_sandbox
from conspo.sink import AnswerRecord, NullSink, Sink, StepRecord, flush_sink
from conspo.system import SystemSampler
from conspo.tasks import Example, Task, make_task
from conspo.tasks.environment import episode_starter
from conspo.tasks.prompts import PromptRenderer, with_prompts
from conspo.tools import make_toolbox
from conspo.training.anchors import Anchors, load_anchors, load_anchors_state, save_anchors
from conspo.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from conspo.training.critic import Critic, load_critic, load_critic_state, save_critic
from conspo.training.logprobs import token_logprobs
from conspo.training.stats import best_of_n, proxy_stats

LoopStep = Callable[[int, Callable[[], bool]], StepRecord | None]


@dataclass
class TrainResult:
    status: Literal["succeeded", "cancelled"]
    last_step: int


@dataclass
class TrainState:
    """Everything a step needs, built once per train() call; rollouts_seen grows each step."""

    cfg: RunConfig
    params: ObjectiveParams
    objective: Callable[..., Any]
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    ref_model: PreTrainedModel | None
    optimizer: torch.optim.Optimizer
    task: Task
    eval_examples: list[Example]
    device: torch.device
    engine: Engine  # generates rollouts and evaluation samples (sampling.engine)
    precision: Precision
    trainable: list[torch.nn.Parameter]  # what the optimiser updates (LoRA: the adapters)
    estimate: MemoryEstimate | None  # of conspo.models.resources; None for a model it cannot size
    rewards: list[WeightedReward]  # the configured reward functions (the verifier among them)
    # the models those rewards call (conspo.models.scoring; None: they call none)
    reward_models: ModelScorers | None = None
    rollouts_seen: int = 0
    trained_steps: int = 0  # steps that took an optimiser step: the lr schedule's clock
    benchmarks: list[Benchmark] = field(default_factory=list)  # prompts rendered
    sink: Sink = field(default_factory=NullSink)  # run_eval reports its phase there
    # A kind's own held-out evaluation, in place of the task's generated answers (its start
    # sets it: a reward model scores held-out pairs); held_out(step) -> its metrics.
    held_out: Callable[[int], dict[str, float]] | None = None
    # The last evaluation's problems (``AnswerRecord``), until ``evaluated`` hands them to the
    # sink with that step's record.
    eval_answers: list[AnswerRecord] = field(default_factory=list)
    # The value model of an objective that reads one (PPO; ``conspo.training.critic``).
    critic: Critic | None = None
    # The anchors of an objective that scores rollouts against them (RRPO;
    # ``conspo.training.anchors``).
    anchors: Anchors | None = None
    # What a step started that must end with the run, before the engine closes (the
    # asynchronous generation's thread, ``conspo.training.pipeline``).
    closers: list[Callable[[], None]] = field(default_factory=list)


Start = Callable[[TrainState, DataFiles, ModelStore], LoopStep]


def run_loop(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    start: Start,
    model_store: ModelStore | None = None,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
) -> TrainResult:
    """Train ``config`` to ``config.steps`` with the step ``start`` returns, resuming from
    ``workdir``'s latest checkpoint.

    What the config may make this process read or allocate: models through ``model_store`` (its
    sources), dataset files through ``files`` (default: any file, size-capped), and, unless
    ``memory_limit`` is None, at most that many bytes by ``conspo.models.resources``' estimate (0:
    the device's memory; any limit is capped at it).
    """
    workdir = Path(workdir)
    if not distributed.is_main():  # in a process group rank 0 alone logs
        sink = NullSink()
    should_stop = distributed.agreed(should_stop)
    files = files or DataFiles()
    store = model_store or builtin_store()
    try:
        state = setup(config, store, files, memory_limit)
    except stopping.Abandoned:  # cancelled while the task was built or the model loaded
        sink.log_event("finished", {"status": "cancelled", "step": 0, "phase": "setup"})
        return TrainResult("cancelled", 0)
    state.sink = sink
    sampler = None
    if config.logging.system_metrics and distributed.is_main():
        sampler = SystemSampler(state.device.type, config.logging.system_interval_s)
    last_step = 0
    try:
        step_fn = start(state, files, store)  # before resume: what it copies is the starting policy
        last_step = resume(state, workdir, sink)
        if distributed.is_main():  # set up: the page's "setting up" turns to training
            sink.log_event("phase", {"phase": "training", "step": last_step})
        if last_step == 0 and config.eval.at_start and distributed.is_main():  # score the start
            scored = run_eval(state, 0)  # stamped when it ends: the steps' clock starts there
            evaluated(state, workdir, sink, StepRecord(0, config.steps, time.time(), scored))
        last_saved = last_step
        while last_step < config.steps and not should_stop():
            try:
                record = step_fn(last_step + 1, should_stop)
            except torch.OutOfMemoryError as exc:
                raise out_of_memory(state, exc) from exc
            if record is None:  # stopped inside the step: the step did not happen
                break
            if sampler is not None:
                if record.step == config.steps:
                    # The last step reads once more, so a run shorter than one sampling
                    # interval still logs its readings (its peak memory above all).
                    sampler.sample()
                record.metrics |= sampler.take()
            last_step = record.step
            evaluated(state, workdir, sink, record)
            every = config.checkpoint.every
            if (every and last_step % every == 0) or last_step == config.steps:
                checkpoint(state, workdir, last_step, sink)
                last_saved = last_step
        if last_step < config.steps:
            if last_saved != last_step:
                checkpoint(state, workdir, last_step, sink)
            flush_sink(sink)  # a buffering sink stores every step before the run ends
            sink.log_event("finished", {"status": "cancelled", "step": last_step})
            return TrainResult("cancelled", last_step)
        flush_sink(sink)
        sink.log_event("finished", {"status": "succeeded", "step": last_step})
        return TrainResult("succeeded", last_step)
    except stopping.Abandoned:
        # Cancelled inside a phase (conspo.stopping): what was logged stays; no checkpoint of
        # a half-done step (a cancelled run is never resumed; its last saved one stands).
        flush_sink(sink)
        sink.log_event("finished", {"status": "cancelled", "step": last_step, "phase": "step"})
        return TrainResult("cancelled", last_step)
    finally:
        for close in state.closers:
            close()
        state.engine.close()  # vllm: its process; the others hold nothing
        if sampler is not None:
            sampler.close()


def eval_due(cfg: RunConfig, step: int) -> bool:
    """Whether step ``step`` ends with the held-out evaluation: every ``eval.every`` steps and
    at the last; rank 0 alone evaluates (the others go on to the next step's first
    collective)."""
    every = cfg.eval.every
    return bool((every and step % every == 0) or step == cfg.steps) and distributed.is_main()


# A job kind's step that takes one optimiser update: its metrics keyed by conspo.metrics keys.
UpdateStep = Callable[[int], dict[str, float]]


def one_update_per_step(start: Callable[[TrainState, DataFiles, ModelStore], UpdateStep]) -> Start:
    """The loop's step for a kind whose step is one optimiser update returning its metrics: the
    learning rate set (``lr_at``), the model in train mode under the precision's autocast, and
    the learning rate, the step time and (when due) the held-out evaluation added."""

    def started(state: TrainState, files: DataFiles, store: ModelStore) -> LoopStep:
        update = start(state, files, store)
        cfg = state.cfg

        def step(n: int, should_stop: Callable[[], bool]) -> StepRecord:
            t0 = time.perf_counter()
            lr = lr_at(cfg, n)
            for group in state.optimizer.param_groups:
                group["lr"] = lr
            state.model.train()
            with state.precision.autocast():
                metrics = update(n)
            state.trained_steps = n
            metrics |= {M.LR: lr, M.TIME_STEP_S: time.perf_counter() - t0}
            if eval_due(cfg, n):
                metrics |= run_eval(state, n)
            return StepRecord(n, cfg.steps, time.time(), metrics)

        return step

    return started


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed that depends only on (seed, step, purpose): the key to exact resume."""
    digest = hashlib.sha256(f"{seed}:{step}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def out_of_memory(state: TrainState, exc: torch.OutOfMemoryError) -> OutOfMemory:
    """The error a step that ran out of device memory ends the run with: what it was estimated
    to need, what the device has, and the settings that lower it."""
    capacity = device_memory(state.device)
    if state.device.type == "cuda":
        torch.cuda.empty_cache()  # the failed step's tensors are gone; what is left is the run's
    cause = str(exc).split("\n", 1)[0]  # e.g. "CUDA out of memory. Tried to allocate 2.00 GiB"
    return OutOfMemory(out_of_memory_message(state.estimate, capacity, state.cfg, cause))


def setup(
    cfg: RunConfig,
    store: ModelStore,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
) -> TrainState:
    check_group(cfg)
    # Model-written code runs in the sandbox or not at all (unless the caller opted in).
    unsafe_local = require_sandbox(cfg.code_execution())
    # A dataset or benchmark it may not read fails before a model loads.
    task = make_task(cfg.task, files)
    stopping.check()
    benchmarks = load_benchmarks(cfg.eval.benchmarks, files or DataFiles())
    device, dtype = pick_device(cfg.model)
    precision = make_precision(dtype, cfg.model.mixed_precision, device)
    path = distributed.main_first(lambda: store.resolve(cfg.model.name))
    dims = model_dims(path)
    limit = None
    if memory_limit is not None:
        capacity = device_memory(device)
        limit = min(memory_limit, capacity) if memory_limit else capacity
    # The task is built, its prompts not yet rendered: an sft step's rows are measured on it.
    estimate = None if dims is None else estimate_memory(cfg, dims, dtype.itemsize, limit, task)
    if estimate is not None:
        check_budget(estimate, cfg)
        if limit is not None:
            check_memory(estimate, limit)
        # The gradient pass runs split as the estimate planned it (optim.memory_budget).
        optim = cfg.optim.model_copy(update={"micro_batch_tokens": estimate.micro_batch_tokens})
        cfg = cfg.model_copy(update={"optim": optim})
    attn = cfg.model.attn_implementation
    head = get_job_kind(cfg.kind).head  # a reward model trains a score head, not the LM's
    model, tokenizer = load_pretrained(path, device, precision.weights, attn, head, cfg.seed)
    stopping.check()
    resolve = lambda name: distributed.main_first(lambda: store.resolve(name))  # noqa: E731
    reward_models = load_reward_models(cfg, resolve, device, precision.weights)
    model = prepare_for_training(model, cfg.model, cfg.seed, head)
    stopping.check_between_layers(model)
    distributed.broadcast_parameters(model)
    sharded = cfg.resources.strategy == "fsdp" and distributed.active()
    if sharded:  # the optimiser must hold the shards (DTensors): shard before building it
        distributed.shard(model)
    render = PromptRenderer(cfg.prompt, tokenizer)
    task = with_prompts(task, render)
    # A kind that trains no objective (sft, distill, dpo) samples, where it does, by the shared
    # defaults: no refill, no reference model.
    params = cfg.objective_params() or ObjectiveParams()
    assert isinstance(params, ObjectiveParams)  # every registered params model extends it
    objective = get_objective(cfg.algorithm) if cfg.algorithm else None
    anchored = objective is not None and objective.anchors
    ref_model = None
    # RRPO's anchors read the reference's hidden states (conspo.training.anchors).
    if (params.needs_reference or anchored) and cfg.model.lora.rank == 0:
        # A frozen copy of the starting policy (the checkpoint never replaces it). With LoRA the
        # reference is the base itself, adapters disabled (reference_logprobs).
        ref_model, _ = load_pretrained(path, device, precision.weights, attn)
        ref_model.eval().requires_grad_(False)
        stopping.check_between_layers(ref_model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    critic = None
    if cfg.algorithm and get_objective(cfg.algorithm).critic:
        assert isinstance(params, PPOParams)
        critic_path = resolve(params.critic_model) if params.critic_model else path
        critic = load_critic(cfg, params, critic_path, device, precision)
    distributed.gather_parameters(model)  # fsdp: full parameters resident until the first update
    return TrainState(
        cfg=cfg,
        params=params,
        objective=get_objective(cfg.algorithm).fn if cfg.algorithm else _no_objective,
        model=model,
        tokenizer=tokenizer,
        ref_model=ref_model,
        optimizer=optimizer,
        task=task,
        eval_examples=task.eval_examples(cfg.task.eval_size),
        device=device,
        engine=tool_engine(
            cfg,
            make_engine(cfg.sampling, path, dtype),
            tokenizer,
            unsafe_local,
            task,
            render,
            lambda name: load_simulator(cfg, store.resolve(name), device, precision.weights),
        ),
        benchmarks=[rendered(b, render) for b in benchmarks],
        precision=precision,
        trainable=trainable,
        estimate=estimate,
        rewards=build_rewards(cfg.rewards),
        reward_models=reward_models,
        critic=critic,
        anchors=load_anchors() if anchored else None,
    )


def tool_engine(
    cfg: RunConfig,
    engine: Engine,
    tokenizer: PreTrainedTokenizerBase,
    unsafe_local: bool,
    task: Task,
    render: PromptRenderer,
    simulator_of: Callable[[str], Simulator] | None = None,
) -> Engine:
    """``engine``, or with ``cfg.tools`` one whose rollouts call them, or with a task that
    plays an environment one whose rollouts play it turn by turn (training and evaluation
    alike: ``conspo.generation.tool_rollout``), talking to the simulator model
    ``simulator_of(environment.simulator)`` when the environment needs one."""
    limits = environment_limits(cfg)
    simulator = None
    if limits is not None and cfg.environment.simulator and simulator_of is not None:
        simulator = simulator_of(cfg.environment.simulator)
    start = None if limits is None else episode_starter(task, limits, simulator)
    if not cfg.tools.names and start is None:
        return engine
    box = make_toolbox(cfg.tools, unsafe_local=unsafe_local)
    play = None
    if start is not None:
        play = EnvironmentPlay(start, turn_format(tokenizer, render.chat))
    return ToolEngine(engine, ToolUse(box, tokenizer, play))


def load_simulator(
    cfg: RunConfig, path: Path | str, device: torch.device, dtype: torch.dtype
) -> Simulator:
    """The environment's simulator model, loaded beside the policy (frozen, greedy)."""
    model, tokenizer = load_pretrained(path, device, dtype)
    model.requires_grad_(False)
    stopping.check_between_layers(model)
    return ModelSimulator(model, tokenizer, cfg.environment.simulator_max_new_tokens)


def environment_limits(cfg: RunConfig) -> EnvironmentLimits | None:
    """What each episode of the run's environment may use (None: its task plays none)."""
    name = cfg.played_environment()
    if name is None:
        return None
    env = cfg.environment
    max_turns = env.max_turns or get_environment(name).needs.max_turns
    return EnvironmentLimits(env.timeout_s, env.max_observation_chars, max_turns)


def check_group(cfg: RunConfig) -> None:
    """What training in a process group needs of the config (conspo.distributed.collectives)."""
    world = distributed.world_size()
    if world == 1:
        return
    if cfg.sampling.prompts_per_step < world:
        raise ValueError(
            f"sampling.prompts_per_step ({cfg.sampling.prompts_per_step}) must be at least the"
            f" number of processes ({world}): every process trains whole groups"
        )


def resume(state: TrainState, workdir: Path, sink: Sink) -> int:
    """Load the latest checkpoint if there is one; returns the last finished step (0 if none)."""
    # Rank 0 picks the checkpoint: every rank must resume from the same step.
    found = distributed.broadcast_object(latest_checkpoint(workdir))
    info = {
        "total_steps": state.cfg.steps,
        "device": describe_device(state.device),
        "model": state.cfg.model.name,
        "dtype": str(state.precision.compute).removeprefix("torch."),
        "mixed_precision": state.precision.mixed,
        "lora_rank": state.cfg.model.lora.rank,
        "trainable_params": sum(p.numel() for p in state.trainable),
        "total_params": sum(p.numel() for p in state.model.parameters()),
        "attn_implementation": state.cfg.model.attn_implementation,
        "gradient_checkpointing": state.cfg.model.gradient_checkpointing,
        # The gradient pass's token budget as planned under optim.memory_budget (0: one pass).
        "micro_batch_tokens": state.cfg.optim.micro_batch_tokens,
        # Distinct held-out problems scored, of task.eval_size asked: fewer where the task's
        # held-out split has fewer (1-digit sums: 24 of 200); also logged as eval/problems.
        "eval_problems": len(state.eval_examples),
        "eval_asked": state.cfg.task.eval_size,
    }
    if distributed.active():
        info["world_size"] = distributed.world_size()
    if found is None:
        sink.log_event("started", info)
        return 0
    step, path = found
    saved = load_checkpoint(path, state.model, state.optimizer)
    if state.critic is not None:
        load_critic_state(state.critic, path)
    if state.anchors is not None:
        load_anchors_state(state.anchors, path)
    state.rollouts_seen = saved["counters"]["rollouts_seen"]
    # Checkpoints from before skipped steps existed: every step had ticked the schedule.
    state.trained_steps = saved["counters"].get("trained_steps", step)
    if state.precision.scaler is not None and "scaler" in saved["counters"]:
        state.precision.scaler.load_state_dict(saved["counters"]["scaler"])
    sink.log_event("resumed", {**info, "step": step, "path": str(path)})
    return step


def checkpoint(state: TrainState, workdir: Path, step: int, sink: Sink) -> None:
    model_state = optimizer_state = None
    if distributed.is_sharded(state.model):  # every rank sends rank 0 its shards
        model_state, optimizer_state = distributed.full_state_dicts(state.model, state.optimizer)
    if not distributed.is_main():  # the replicas are identical: rank 0 writes for all
        return
    # Flush first: a resume re-emits only the steps after this checkpoint, so every step up to
    # it must be stored before the checkpoint exists (a buffering sink may hold some back).
    flush_sink(sink)
    counters: dict[str, Any] = {
        "rollouts_seen": state.rollouts_seen,
        "trained_steps": state.trained_steps,
    }
    if state.precision.scaler is not None:  # float16's loss scale is part of exact resume
        counters["scaler"] = state.precision.scaler.state_dict()
    path = save_checkpoint(
        workdir,
        step,
        state.model,
        state.tokenizer,
        state.optimizer,
        counters,
        state.cfg.checkpoint.keep,
        model_state,
        optimizer_state,
        extra=checkpoint_extras(state),
    )
    sink.log_event("checkpoint", {"step": step, "path": str(path)})


def checkpoint_extras(state: TrainState) -> Callable[[Path], None] | None:
    """What a checkpoint keeps beside the policy: the critic (PPO), the anchors (RRPO)."""
    savers: list[Callable[[Path], None]] = []
    if state.critic is not None:
        savers.append(partial(save_critic, state.critic))
    if state.anchors is not None:
        savers.append(partial(save_anchors, state.anchors))
    if not savers:
        return None

    def save_all(directory: Path) -> None:
        for save in savers:
            save(directory)

    return save_all


def lr_at(cfg: RunConfig, step: int) -> float:
    """Linear warmup over optim.warmup_steps, then constant; ``step`` counts the steps that
    updated (a skipped step does not tick it)."""
    warm = cfg.optim.warmup_steps
    return cfg.optim.lr * (min(1.0, step / warm) if warm else 1.0)


def _no_objective(batch: Any, params: Any) -> Any:
    raise RuntimeError("this run's job kind trains no objective (config.algorithm is null)")


def run_eval(state: TrainState, step: int) -> dict[str, float]:
    """Greedy accuracy and pass@k on the held-out split, avg@k and pass@k on each benchmark
    (conspo.evaluation); every sample drawn at eval.temperature and eval.top_p; and its
    seconds (``time/eval_s``).

    The sink hears a ``phase`` event as it starts ("evaluating") and ends ("training"): an
    evaluation may take minutes with no step logged (the run page says what the run is doing),
    and its seconds are what the ETA counts apart from the steps' (``backend.runs.progress``)."""
    state.sink.log_event("phase", {"phase": "evaluating", "step": step})
    t0 = time.perf_counter()
    with state.precision.autocast():
        metrics = _eval_metrics(state, step)
    metrics[M.TIME_EVAL_S] = time.perf_counter() - t0
    state.sink.log_event("phase", {"phase": "training", "step": step})
    return metrics


def _eval_metrics(state: TrainState, step: int) -> dict[str, float]:
    cfg = state.cfg
    state.model.eval()
    if state.held_out is not None:
        return state.held_out(step)
    state.eval_answers = []  # an evaluation whose step was never logged (a stop) leaves none
    # The same noise at every evaluation (common random numbers: two checkpoints differ by their
    # policies, not their draws), and in every run of this seed, so a chained run's step-0 eval
    # repeats the final eval of the run it starts from (an SFT → RL pipeline compares alike).
    generator = torch.Generator(device=state.device).manual_seed(step_seed(cfg.seed, 0, "eval"))
    metrics = evaluate(
        state.model,
        state.tokenizer,
        state.task,
        state.eval_examples,
        max_new_tokens=cfg.sampling.max_new_tokens,
        pass_k=cfg.eval.pass_k,
        temperature=cfg.eval.temperature,
        top_p=cfg.eval.top_p,
        generator=generator,
        engine=state.engine,
        proxy=held_out_proxy(state) if cfg.proxy_rewards() or cfg.eval.best_of else None,
        on_problems=state.eval_answers.extend,
        # A sharded model's forward needs every rank, and rank 0 alone evaluates.
        score_answers=None
        if distributed.is_sharded(state.model)
        else partial(answer_scores, state.model),
    )
    for benchmark in state.benchmarks:
        metrics |= score_benchmark(
            state.model,
            state.tokenizer,
            benchmark,
            max_new_tokens=cfg.sampling.max_new_tokens,
            temperature=cfg.eval.temperature,
            top_p=cfg.eval.top_p,
            generator=generator,
            engine=state.engine,
            on_problems=state.eval_answers.extend,
        )
    return metrics


@torch.no_grad()
def answer_scores(model: PreTrainedModel, batch: RolloutBatch) -> list[float | None]:
    """Each answer's s_θ under the policy (temperature 1): the length-normalised log-prob of the
    tokens the model wrote, ``ANSWER_SCORE_ROWS`` answers per forward."""
    out: list[float | None] = []
    for start in range(0, batch.response_ids.shape[0], ANSWER_SCORE_ROWS):
        part = slice(start, start + ANSWER_SCORE_ROWS)
        rows = replace(
            batch,
            prompt_ids=batch.prompt_ids[part],
            prompt_mask=batch.prompt_mask[part],
            response_ids=batch.response_ids[part],
            response_mask=batch.response_mask[part],
            lengths=batch.lengths[part],
            truncated=batch.truncated[part],
            observation_mask=None
            if batch.observation_mask is None
            else batch.observation_mask[part],
            tool_calls=None,
            sampled_logprobs=None,
            turn_index=None if batch.turn_index is None else batch.turn_index[part],
            episodes=None,
        )
        logprobs, _ = token_logprobs(model, rows, 1.0)
        scores = sequence_scores(logprobs.float(), rows.model_mask.to(logprobs.device))
        out.extend(v if math.isfinite(v) else None for v in scores.tolist())
    return out


ANSWER_SCORE_ROWS = 16  # held-out answers scored per forward


def evaluated(state: TrainState, workdir: Path, sink: Sink, record: StepRecord) -> None:
    """Log ``record`` (with the problems of an evaluation it holds); when it holds
    eval.best_metric at a new best, keep this step's model as checkpoints/best and log a
    ``best`` event."""
    if state.eval_answers:
        record.answers, state.eval_answers = state.eval_answers, []
    sink.log_step(record)
    key = state.cfg.eval.best_metric
    if key is None:
        return
    value = record.metrics.get(key)  # rank 0 alone evaluates
    best = value is not None and improves(key, value, best_so_far(workdir))
    model_state = None
    if distributed.is_sharded(state.model):  # rank 0's answer, and the shards to write
        if not distributed.broadcast_object(best):
            return
        model_state, _ = distributed.full_state_dicts(state.model, state.optimizer)
    if best and distributed.is_main():
        assert value is not None
        info = save_best(
            workdir, record.step, key, value, state.model, state.tokenizer, model_state
        )
        sink.log_event("best", {**info, "path": str(workdir / "checkpoints" / "best")})


# The held-out proxy-vs-truth keys, by the step's keys (conspo.training.stats.proxy_stats).
HELD_OUT_PROXY = {
    M.PROXY_REWARD: M.EVAL_PROXY_REWARD,
    M.PROXY_TRUTH: M.EVAL_PROXY_TRUTH,
    M.PROXY_AGREEMENT: M.EVAL_PROXY_AGREEMENT,
    M.PROXY_SPEARMAN: M.EVAL_PROXY_SPEARMAN,
}


def held_out_proxy(state: TrainState) -> HeldOutProxy:
    """The held-out pass@k samples (k per problem) scored with the run's rewards: the
    proxy-vs-truth view (``RunConfig.truth``; ``proxy_stats``, a problem's samples its group)
    as eval/proxy_*, and best-of-N by eval.best_of (``best_of_n``). The verifier is not run
    again: its outcomes are the ones the evaluation verified. A reward that fails is contained
    as in training."""
    cfg = state.cfg
    context = RewardContext(
        state.task, cfg.sampling.max_new_tokens, models=state.reward_models
    )  # no policy scorer: a reward reading the policy (info_gain) fails, contained

    def score(
        texts: list[str], examples: list[Example], lengths: list[int], outcomes: list[float], k: int
    ) -> dict[str, float]:
        known = [
            replace(r, fn=lambda *_: outcomes, batched=True) if r.name == VERIFIER else r
            for r in state.rewards
        ]
        scored = score_rollouts(known, texts, examples, lengths, replace(context, group_size=k))
        out: dict[str, float] = {}
        if cfg.proxy_rewards():
            groups = [i // k for i in range(len(texts))]
            stats = proxy_stats(scored.shaped, scored.parts[cfg.truth], groups)
            out |= {HELD_OUT_PROXY[key]: v for key, v in stats.items() if key in HELD_OUT_PROXY}
        if cfg.eval.best_of is not None:
            out |= best_of_n(scored.parts[cfg.eval.best_of], outcomes, k)
        return out

    return score


def optimiser_step(state: TrainState, loss: torch.Tensor) -> float:
    """Backward ``loss`` and one optimiser step through the run's ``Precision`` (scaled under
    float16, clipped at optim.max_grad_norm); returns the gradient norm before clipping."""
    state.optimizer.zero_grad(set_to_none=True)
    state.precision.backward(loss)
    norm = state.precision.step(state.optimizer, state.trainable, state.cfg.optim.max_grad_norm)
    return float(norm)
