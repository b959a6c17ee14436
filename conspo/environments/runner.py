"""Playing an environment with everything it may do wrong contained.

An environment is user code fed model text. Each call into it (creation, ``reset``, ``step``,
``final_reward``, ``close``) runs in a thread of its own, waited on for at most
``EnvironmentLimits.timeout_s``, and what it returns is checked before anyone reads it. An
environment that raises, hangs, returns a wrong type, a NaN or infinite reward or a ``done``
that is not a bool fails its own episode, with the reason recorded (``Episode.failure``); a
huge observation is cut to ``max_observation_chars`` (head and tail kept, the cut said inside
it, as a tool's output is) and the turn goes on. Each episode has its own runner and shares
nothing, so a failed one leaves the step's other episodes as they were.

A hung call cannot be killed (Python has no way to stop a thread): its thread is abandoned
(a daemon: it never holds the process at exit) together with the environment, which is never
called again, not even ``close``, since it is still inside a call. The caller is back within
the timeout (and within a slice of a wait after a cancel: ``conspo.stopping``); the leaked
thread costs what the hung call holds until it returns, if ever.

    runner = EpisodeRunner(lambda: GuessNumber(params, example, seed), EnvironmentLimits())
    prompt_tail = runner.reset()          # None when the environment failed already
    while not runner.over:
        runner.step(model_action)         # a Turn
    episode = runner.finish()             # the Episode: turns, rewards, failure
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from conspo import stopping
from conspo.environments.base import Environment, Episode, StepResult, Turn
from conspo.tools.base import cut_output

log = logging.getLogger(__name__)

# How often a wait on an environment call looks at the cancel check (conspo.stopping).
WAIT_SLICE_S = 0.25
# The characters of an exception's message kept in a failure reason.
MAX_REASON_CHARS = 500

V = TypeVar("V")


@dataclass(frozen=True)
class EnvironmentLimits:
    """What one episode may use: from the run's environment settings (a later task)."""

    timeout_s: float = 10.0  # one call into the environment (create, reset, step, ...)
    max_observation_chars: int = 4096  # an observation longer than this is cut (head and tail)
    max_turns: int = 10  # actions per episode; the episode is truncated after the last


class EnvironmentFault(Exception):
    """A call into an environment failed its episode; the message is the reason recorded."""


def contained_call(fn: Callable[[], V], *, timeout_s: float, what: str) -> V:
    """``fn()`` run in a thread of its own: its value, or ``EnvironmentFault`` when it raised
    (anything, SystemExit included) or ran past ``timeout_s``, whose thread is then left
    running (module docstring). ``stopping.check()`` is asked while waiting."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # user code: even SystemExit is only its episode's end
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"environment {what}", daemon=True)
    deadline = time.monotonic() + timeout_s
    thread.start()
    while thread.is_alive():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EnvironmentFault(f"{what} timed out after {timeout_s:g} s")
        thread.join(min(remaining, WAIT_SLICE_S))
        stopping.check()
    if "error" in outcome:
        exc = outcome["error"]
        message = cut_output(str(exc), MAX_REASON_CHARS)
        raise EnvironmentFault(f"{what} raised {type(exc).__name__}: {message}")
    return outcome["value"]


def checked_observation(value: object, what: str, limits: EnvironmentLimits) -> tuple[str, int]:
    """(the observation as the model may read it, the characters cut): a str, cut to the limit,
    lone surrogates (which no tokenizer or database takes) replaced."""
    if not isinstance(value, str):
        raise EnvironmentFault(f"{what} returned {type(value).__name__}, not a str observation")
    text = value.encode("utf-8", "replace").decode("utf-8")
    cut = cut_output(text, limits.max_observation_chars)
    return cut, len(text) - len(cut) if cut != text else 0


def checked_reward(value: object, what: str) -> float:
    """A finite real number (a bool is not one) as a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EnvironmentFault(f"{what} is {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise EnvironmentFault(f"{what} is {value}, not a finite number")
    return float(value)


def play_turn(env: Environment, action: str, limits: EnvironmentLimits) -> Turn:
    """One contained ``env.step(action)``: the turn as played, or a turn whose ``error`` says
    why the episode failed (it is then done, with no reward)."""
    started = time.monotonic()
    try:
        result = contained_call(lambda: env.step(action), timeout_s=limits.timeout_s, what="step")
        if not isinstance(result, StepResult):
            raise EnvironmentFault(f"step returned {type(result).__name__}, not a StepResult")
        observation, cut = checked_observation(result.observation, "step", limits)
        reward = checked_reward(result.reward, "step's reward")
        if not isinstance(result.done, bool):
            raise EnvironmentFault(f"step's done is {type(result.done).__name__}, not a bool")
        if not isinstance(result.info, dict):
            raise EnvironmentFault(f"step's info is {type(result.info).__name__}, not a dict")
    except EnvironmentFault as fault:
        seconds = time.monotonic() - started
        return Turn(action, "", 0.0, True, seconds, error=str(fault))
    seconds = time.monotonic() - started
    return Turn(action, observation, reward, result.done, seconds, None, cut, result.info)


class EpisodeRunner:
    """One episode, played turn by turn by whoever holds the model's actions (module
    docstring). Every call into the environment is contained (``contained_call``)."""

    def __init__(self, make: Callable[[], Environment], limits: EnvironmentLimits) -> None:
        self.limits = limits
        self._make = make
        self._env: Environment | None = None
        self._turns: list[Turn] = []
        self._first_observation = ""
        self._failure: str | None = None
        self._abandoned = False  # a call hung: the environment is never called again
        self._done = False
        self._finished: Episode | None = None

    @property
    def environment(self) -> Environment | None:
        """The environment once created (None before ``reset`` or when creating it failed)."""
        return self._env

    @property
    def failed(self) -> bool:
        return self._failure is not None

    @property
    def over(self) -> bool:
        """No further action is taken: done, failed, or at the turn limit."""
        return self._done or self.failed or len(self._turns) >= self.limits.max_turns

    def reset(self) -> str | None:
        """Create the environment and return its first observation; None when either failed
        (the episode is then failed, and ``over``)."""
        try:
            self._env = self._call(self._make, "creating the environment")
            first = self._call(self._env.reset, "reset")
            self._first_observation, _ = checked_observation(first, "reset", self.limits)
        except EnvironmentFault as fault:
            self._fail(str(fault))
            return None
        return self._first_observation

    def step(self, action: str) -> Turn:
        """Play one action; the turn as recorded (its ``error`` set when it failed the episode)."""
        if self._env is None or self.over:
            raise RuntimeError("this episode takes no action: not reset, or over")
        try:
            turn = play_turn(self._env, action, self.limits)
        except stopping.Abandoned:
            self._cancelled()
            raise
        self._turns.append(turn)
        if turn.error is not None:
            self._fail(turn.error)
        self._done = turn.done
        return turn

    def finish(self, cut: bool = False) -> Episode:
        """The episode as played: the environment's final reward read and the environment
        closed (each contained; a failing ``close`` is logged and changes nothing). ``cut``:
        its player stopped before the environment said done (a rollout out of tokens), so the
        episode is truncated even with no turn played."""
        if self._finished is not None:
            return self._finished
        final: float | None = None
        env = self._env
        if env is not None and not self.failed:
            final_reward = getattr(env, "final_reward", None)
            try:
                if callable(final_reward):
                    value = self._call(final_reward, "final_reward")
                    final = None if value is None else checked_reward(value, "final_reward")
            except EnvironmentFault as fault:
                self._fail(str(fault))
        if env is not None and not self._abandoned:
            try:
                self._call(env.close, "close")
            except EnvironmentFault as fault:
                log.warning("environment %s: %s", type(env).__name__, fault)
        truncated = not self.failed and not self._done and (bool(self._turns) or cut)
        self._finished = Episode(
            tuple(self._turns), final, self._failure, self._first_observation, truncated
        )
        return self._finished

    def _call(self, fn: Callable[[], V], what: str) -> V:
        try:
            return contained_call(fn, timeout_s=self.limits.timeout_s, what=what)
        except stopping.Abandoned:
            self._cancelled()
            raise
        except EnvironmentFault as fault:
            if "timed out" in str(fault):
                self._abandoned = True
            raise

    def _cancelled(self) -> None:
        """The run was cancelled while a call was under way: that call's thread may still be
        inside the environment, so it is abandoned as a hung one is."""
        self._abandoned = True
        self._fail("cancelled while the environment was in a call")

    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
        if "timed out after" in reason:
            self._abandoned = True


def play_episode(
    make: Callable[[], Environment], player: Callable[[str], str], limits: EnvironmentLimits
) -> Episode:
    """A whole episode with ``player(observation) -> action`` choosing each action (a scripted
    player, a task's check of a single answer); ``player`` itself is not contained."""
    runner = EpisodeRunner(make, limits)
    observation = runner.reset()
    while observation is not None and not runner.over:
        turn = runner.step(player(observation))
        observation = turn.observation
    return runner.finish()
