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

The server is never allowed to break training: every request is retried a few times, a failed
flush keeps its points for the next one, and after that everything is a warning. A training
crash marks the run failed (an uncaught exception seen at interpreter exit, or ``fail(exc)``).
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
# TRL's mean of one reward function, rewards/<name>/mean, is the catalogue's reward/<name>.
REWARD_FUNC_KEY = re.compile(r"^rewards/([\w.-]+)/mean$")


def map_logs(logs: Mapping[str, Any], binary_reward: bool = True) -> dict[str, float]:
    """The lab metrics for one ``on_log`` dict: numeric values only, originals under ``trl/``.

    NaN/Inf are kept (the client sends them as null; the server stores null). With
    ``binary_reward`` (verifiable 0/1 rewards), the mean ``reward`` is the pass rate. Keys of the
    catalogue (what ``ConSPOTrainer`` logs) are kept as they are, once.
    """
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # strings, None (TRL logs None when no reward was valid), tensors...
        value = float(value)
        if M.metric(key) is not None:
            out[key] = value
            continue
        out[TRL_PREFIX + key] = value
        reward_func = REWARD_FUNC_KEY.match(key)
        if key in KEY_MAP:
            out[KEY_MAP[key]] = value
        elif reward_func is not None:
            out[M.reward_key(reward_func.group(1))] = value
        elif key == REWARD_KEY and binary_reward and (not math.isfinite(value) or 0 <= value <= 1):
            out[PASS_RATE_KEY] = value
    return out


class ConSPOLabCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that streams a trainer's logs into ConSPO Lab.

    client:        a ``conspo_lab.client.Client`` or the server URL (None: CONSPO_URL/default).
    token:         API token when ``client`` is a URL (None: CONSPO_TOKEN / data/token).
    run_name:      the run's display name.
    config:        free JSON stored with the run (e.g. your GRPOConfig as a dict).
    algorithm, task, model: shown in the run list (model defaults to the trainer's model name).
    binary_reward: rewards are 0/1 (verifiable), so TRL's mean ``reward`` is ``batch/pass_rate``.
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
        metrics = map_logs(logs, self.binary_reward)
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
        self._rollouts[step] = [{"step": step, **asdict(r)} for r in rollouts]

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
        if not self.flush(status=status, error=error):
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
