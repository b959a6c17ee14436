"""Log a Hugging Face / TRL trainer (e.g. ``GRPOTrainer``) into a ConSPO Lab server.

    from conspo_lab.trl_bridge import ConSPOLabCallback
    lab = ConSPOLabCallback("http://127.0.0.1:8000", token, run_name="trl-grpo", config=vars(args))
    trainer = GRPOTrainer(..., args=GRPOConfig(logging_steps=1, ...), callbacks=[lab])
    trainer.train()

At ``on_train_begin`` it creates an external run (``POST /api/runs/external``); every ``on_log``
call's numeric values are buffered under the trainer's global step and sent in small batches
(``POST /api/runs/{id}/log``); ``on_train_end`` flushes and marks the run succeeded. Set TRL's
``logging_steps=1``: its default of 10 logs the mean of 10 steps, not per-step curves.

With ``conspo.integrations.trl.ConSPOTrainer`` the logs also carry the §4 separation statistics
under the catalogue's own keys (``sep/gap``, ``conspo/p_pos``, ...), which pass through
unchanged, and the trainer hands each step's sample of per-rollout scores to ``on_rollouts``;
they are sent with the step's points, so the run page draws the same separation views and score
distributions as a native run's. Under ``accelerate launch`` only the main process logs (the
trainer has already gathered the statistics of every process).

With a plain ``GRPOTrainer`` there are no per-rollout scores, so the separation panels stay
empty (the run page says they need ``ConSPOTrainer``); what TRL's reward statistics do tell is
logged under the catalogue's keys: the pass rate (mean 0/1 reward) and the mixed ("valid")
groups per step (groups whose rewards are not all equal, from ``frac_reward_zero_std``). TRL's
reward spread stays as it is, ``trl/reward_std`` (the catalogue has no key of that meaning).

The server is never allowed to break training: every request is retried a few times, a failed
flush keeps its points for the next one, and after that everything is a warning. A training
crash marks the run failed (an uncaught exception seen at interpreter exit, or ``fail(exc)``).

Cancelling the run on the platform stops the trainer: the server refuses the next flush (the run
no longer accepts points: 409 once cancelled, 404 once deleted), the callback says so once and
sets ``control.should_training_stop``, so TRL ends after the step it is in. That flush comes
within ``flush_steps`` steps or ``flush_seconds`` (each step when a step takes longer).
"""

from __future__ import annotations

import atexit
import logging
import math
import re
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from conspo import metrics as M
from conspo.sink import RolloutRecord
from conspo_lab.client import ApiError, Client

log = logging.getLogger(__name__)

# TRL / HF Trainer key -> the catalogue key (conspo.metrics) with the same meaning, so a TRL
# run's page draws them in the same charts as a native run. Every original is also kept under
# "trl/<key>" (TRL's completion lengths, for instance, are not split by correctness as len/pos
# and len/neg are, so they stay there). `reward` becomes the pass rate only for binary (0/1)
# rewards, see below.
KEY_MAP: dict[str, str] = {
    "loss": M.LOSS,
    "grad_norm": M.GRAD_NORM,
    "entropy": M.ENTROPY,
    "kl": M.KL,
    "learning_rate": M.LR,
}
REWARD_KEY = "reward"
PASS_RATE_KEY = M.BATCH_PASS_RATE
TRL_PREFIX = "trl/"
# Steps of rollout samples kept while the server is away (64 rollouts each stay well under the
# 10,000 rollouts one log call takes).
MAX_ROLLOUT_STEPS = 100
# RolloutRecord fields the log API does not take (a TRL rollout has none of them)
NOT_LOGGED = ("episode", "critique")
# TRL's mean of one reward function, rewards/<name>/mean, is the catalogue's reward/<name>.
REWARD_FUNC_KEY = re.compile(r"^rewards/([\w.-]+)/mean$")
# TRL's share of rollouts whose group's rewards all agree (std 0): with 0/1 rewards, 1 − it is
# the share of mixed groups, the ones that train (batch/valid_groups counts them).
ZERO_STD_KEY = "frac_reward_zero_std"
# A log refused with one of these is for a run that no longer accepts points: cancelled or
# finished (409), deleted (404), gone (410). Retrying cannot help; the trainer is stopped.
RUN_CLOSED = frozenset({404, 409, 410})


def map_logs(
    logs: Mapping[str, Any], binary_reward: bool = True, groups: int | None = None
) -> dict[str, float]:
    """The lab metrics for one ``on_log`` dict: numeric values only, originals under ``trl/``.

    NaN/Inf are kept (the client sends them as null; the server stores null). With
    ``binary_reward`` (verifiable 0/1 rewards), the mean ``reward`` is the pass rate and, given
    ``groups`` (groups per generation batch, when TRL's zero-std share is per group), the
    zero-std share gives the mixed groups. Keys of the catalogue (what ``ConSPOTrainer`` logs)
    are kept as they are, once, and win over a value mapped from TRL's keys.
    """
    out: dict[str, float] = {}
    mapped: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # strings, None (TRL logs None when no reward was valid), tensors...
        value = float(value)
        if M.metric(key) is not None:
            out[key] = value
            continue
        out[TRL_PREFIX + key] = value
        reward_func = REWARD_FUNC_KEY.match(key)
        share = not math.isfinite(value) or 0 <= value <= 1
        if key in KEY_MAP:
            mapped[KEY_MAP[key]] = value
        elif reward_func is not None:
            mapped[M.reward_key(reward_func.group(1))] = value
        elif key == REWARD_KEY and binary_reward and share:
            mapped[PASS_RATE_KEY] = value
        elif key == ZERO_STD_KEY and binary_reward and groups and share:
            # a whole count per step, a mean of counts over a logging window of several
            mapped[M.BATCH_VALID_GROUPS] = round((1 - value) * groups, 6)
    return mapped | out


def groups_per_batch(args: Any) -> int | None:
    """Groups in one of TRL's generation batches, when its ``frac_reward_zero_std`` is a share of
    groups (rewards summed, then normalised per group or not at all); else None."""
    generation = getattr(args, "generation_batch_size", None)
    size = getattr(args, "num_generations", None)
    if not isinstance(generation, int) or not isinstance(size, int) or size <= 0:
        return None  # not a GRPOConfig
    scale = getattr(args, "scale_rewards", "group")
    per_group = scale in ("group", "none", True, False)  # older TRL: True is group, False none
    summed = getattr(args, "multi_objective_aggregation", "sum_then_normalize")
    return generation // size if per_group and summed == "sum_then_normalize" else None


class ConSPOLabCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that streams a trainer's logs into ConSPO Lab.

    client:        a ``conspo_lab.client.Client`` or the server URL (None: CONSPO_URL/default).
    token:         API token when ``client`` is a URL (None: CONSPO_TOKEN / data/token).
    run_name:      the run's display name.
    config:        free JSON stored with the run (e.g. your GRPOConfig as a dict).
    algorithm, task, model: shown in the run list (model defaults to the trainer's model name).
    binary_reward: rewards are 0/1 (verifiable), so TRL's mean ``reward`` is ``batch/pass_rate``
                   and its groups of unequal rewards are ``batch/valid_groups``.
    flush_steps / flush_seconds: send when this many steps are buffered or this long passed.
    retries:       attempts per request before the points wait for the next flush.
    """

    def __init__(
        self,
        client: Client | str | None = None,
        token: str | None = None,
        run_name: str = "trl",
        config: Mapping[str, Any] | None = None,
        tags: Sequence[str] = ("trl",),
        algorithm: str = "trl-grpo",
        task: str = "external",
        model: str | None = None,
        binary_reward: bool = True,
        flush_steps: int = 5,
        flush_seconds: float = 5.0,
        retries: int = 3,
        retry_wait: float = 0.5,
        timeout: float = 10.0,
    ) -> None:
        self.client = client if isinstance(client, Client) else Client(client, token, timeout)
        self.run_name = run_name
        self.config = dict(config or {})
        self.tags = list(tags)
        self.algorithm = algorithm
        self.task = task
        self.model = model
        self.binary_reward = binary_reward
        self.flush_steps = flush_steps
        self.flush_seconds = flush_seconds
        self.retries = retries
        self.retry_wait = retry_wait
        self.run_id: int | None = None
        self.total_steps: int | None = None
        self.groups: int | None = None  # per generation batch (``groups_per_batch``)
        # why the server refused the run's points (cancelled, deleted): the trainer is stopped
        self.stopped: str | None = None
        self._pending: dict[int, dict[str, Any]] = {}
        self._rollouts: dict[int, list[dict[str, Any]]] = {}
        self._last_flush = time.monotonic()
        self._finished = False
        self._active = False
        self._other_process = False
        self._crash: str | None = None
        self._prev_excepthook: Callable[..., Any] | None = None
        self._hook: Callable[..., Any] | None = None

    # --- trainer hooks ----------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero:
            self._other_process = True  # one process logs for all of them; this one never
            return
        self.total_steps = state.max_steps or None
        self.groups = groups_per_batch(args)
        self.stopped = None
        if self.model is None:
            model = kwargs.get("model")
            self.model = getattr(getattr(model, "config", None), "_name_or_path", None) or "hf"
        if getattr(args, "logging_steps", 1) not in (1, 1.0):
            log.warning(
                "ConSPO Lab: logging_steps=%s, so each point is a mean over that many steps;"
                " set logging_steps=1 for per-step curves",
                args.logging_steps,
            )
        self._active = True
        self._finished = False
        self._create_run()
        self._install_crash_hooks()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self._active or not logs:
            return
        metrics = map_logs(logs, self.binary_reward, self.groups)
        if not metrics:
            return
        entry = self._pending.setdefault(
            state.global_step, {"step": state.global_step, "metrics": {}}
        )
        entry["metrics"].update(metrics)
        entry["wall_time"] = time.time()
        due = time.monotonic() - self._last_flush >= self.flush_seconds
        if len(self._pending) >= self.flush_steps or due:
            self.flush()
        if self.stopped is not None:
            control.should_training_stop = True  # TRL checks it right after logging

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.stopped is not None:  # refused at a flush outside on_log (``flush()`` by hand)
            control.should_training_stop = True

    def on_rollouts(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        step: int,
        rollouts: Sequence[RolloutRecord],
        **kwargs: Any,
    ) -> None:
        """A step's sample of per-rollout scores (``ConSPOTrainer``), sent with its points."""
        if not self._active:
            return
        # a TRL rollout plays no environment of ours and no judge: its record's episode and
        # critique (None) are not fields the log API takes
        self._rollouts[step] = [
            {"step": step, **{k: v for k, v in asdict(r).items() if k not in NOT_LOGGED}}
            for r in rollouts
        ]

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._active:
            self.finish("succeeded")

    # --- public -----------------------------------------------------------------------------

    def flush(self, status: str | None = None, error: str | None = None) -> bool:
        """Send the buffered steps (and a status); False if the server did not take them."""
        self._last_flush = time.monotonic()
        if self.run_id is None and not self._create_run():
            return False
        run_id = self.run_id
        assert run_id is not None
        steps = [self._pending[s] for s in sorted(self._pending)]
        rollout_steps = sorted(self._rollouts)
        rollouts = [row for s in rollout_steps for row in self._rollouts[s]]
        if not steps and not rollouts and status is None:
            return True
        sent = self._call(
            "log",
            lambda: self.client.log_steps(
                run_id, steps, rollouts=rollouts, status=status, error=error
            ),
        )
        if sent is not None:
            for row in steps:
                self._pending.pop(row["step"], None)
            for step in rollout_steps:
                self._rollouts.pop(step, None)
            return True
        if len(self._pending) > 100_000:  # a long outage: keep memory bounded, newest win
            for step in sorted(self._pending)[:-100_000]:
                del self._pending[step]
        for step in rollout_steps[:-MAX_ROLLOUT_STEPS]:  # and within one call's rollout limit
            del self._rollouts[step]
        return False

    def finish(self, status: str = "succeeded", error: str | None = None) -> None:
        """Flush and mark the run finished (succeeded or failed). Called once."""
        if self._finished or self._other_process:
            return
        self._finished = True
        self._active = False
        if not self.flush(status=status, error=error) and self.stopped is None:
            log.warning("ConSPO Lab: could not mark run %s %s", self.run_id, status)
        self._remove_crash_hooks()

    def fail(self, exc: BaseException | str) -> None:
        """Mark the run failed, e.g. ``except Exception as e: cb.fail(e); raise``."""
        if isinstance(exc, BaseException):
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        else:
            text = exc
        self.finish("failed", error=text[-2000:])

    # --- internals --------------------------------------------------------------------------

    def _create_run(self) -> bool:
        run = self._call(
            "create run",
            lambda: self.client.create_external_run(
                name=self.run_name,
                config=self.config,
                algorithm=self.algorithm,
                task=self.task,
                model=self.model or "hf",
                tags=self.tags,
                total_steps=self.total_steps,
            ),
        )
        if run is None:
            return False
        self.run_id = run.id
        log.info("ConSPO Lab: logging to run %s at %s", run.id, self.client.base_url)
        return True

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` with retries; None (and a warning) when every attempt failed."""
        for attempt in range(1, self.retries + 1):
            try:
                return fn()
            except ApiError as exc:
                if what == "log" and exc.status in RUN_CLOSED:
                    self._run_closed(exc)
                    return None
                if 400 <= exc.status < 500 and exc.status not in (408, 429):
                    log.warning("ConSPO Lab: %s rejected: %s", what, exc)
                    return None  # a bad request will not get better by retrying
                error: Exception = exc
            except Exception as exc:  # never let the lab break training
                error = exc
            if attempt < self.retries:
                time.sleep(self.retry_wait * 2 ** (attempt - 1))
        log.warning("ConSPO Lab: %s failed after %d attempts: %s", what, self.retries, error)
        return None

    def _run_closed(self, exc: ApiError) -> None:
        """The run no longer accepts points (cancelled or deleted on the platform): say so once,
        log nothing more, and have the trainer stop (``on_log`` / ``on_step_end``)."""
        self.stopped = str(exc.detail)
        self._active = False
        self._finished = True  # nothing more to mark: the platform closed the run
        self._pending.clear()
        self._rollouts.clear()
        self._remove_crash_hooks()
        log.warning(
            "ConSPO Lab: run %s no longer accepts points (%s): stopping training",
            self.run_id,
            self.stopped,
        )

    def _install_crash_hooks(self) -> None:
        """TrainerCallback has no error hook: an uncaught exception reaches sys.excepthook and
        the interpreter then runs atexit handlers, where the run is marked failed."""
        if self._prev_excepthook is not None:
            return
        self._prev_excepthook = sys.excepthook

        def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
            self._crash = "".join(traceback.format_exception_only(exc_type, exc)).strip()
            assert self._prev_excepthook is not None
            self._prev_excepthook(exc_type, exc, tb)

        self._hook = hook
        sys.excepthook = hook
        atexit.register(self._at_exit)

    def _remove_crash_hooks(self) -> None:
        if self._prev_excepthook is not None and sys.excepthook is self._hook:
            sys.excepthook = self._prev_excepthook
        self._prev_excepthook = None
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        if self._active and not self._finished:
            self.fail(self._crash or "the training process exited before on_train_end")
