"""Submit-time checks that need a task built: can it be drawn from within a budget, and does its
held-out split hold as many distinct problems as ``task.eval_size`` asks for.

A procedural task's config sets what building it costs (``conspo.tasks.probe``), so it is
built in a probe helper process, never on a request thread, and only for an authenticated
caller (submitting, or an estimate with a token). The helpers are a bulkhead: ``slots`` of them
(``CONSPO_TASK_CHECK_SLOTS``), a caller waits ``task_check_wait_s`` at most for one, then gets
a 503 with Retry-After (``Busy``) — a flood of slow configs fills the helpers and nothing else:
reads, health and the other writes keep their threads and connections. Results are remembered
per (task, eval_size), so a study's arms and a form's repeated estimates build each task once.

    checks = task_checks.for_settings(settings)
    problems = checks.problems(config)      # [(loc, message, value)], may raise Busy
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from backend.config import Settings
from backend.errors import Busy
from conspo.config import RunConfig, TaskConfig
from conspo.tasks.probe import ProbeBudget, ProberBusy, TaskProbe, TaskProber, TaskRefused, probed

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str, Any]
REMEMBERED = 512  # (task, eval_size) results kept


class TaskChecks:
    def __init__(self, slots: int, wait_s: float, budget: ProbeBudget) -> None:
        self.prober = TaskProber(slots=slots, wait_s=wait_s)
        self.budget = budget
        # Callers admitted at once: one per helper plus as many waiting; the rest are told at
        # once (no thread or connection held waiting in line).
        self._admitted = threading.BoundedSemaphore(2 * slots)
        self._known: OrderedDict[str, TaskProbe | str] = OrderedDict()
        self._lock = threading.Lock()

    def probe(self, task: TaskConfig, eval_size: int) -> TaskProbe:
        """The task's probe (remembered); raises ``TaskRefused``, or ``Busy`` when every helper
        stayed busy for the wait."""
        key = f"{eval_size}:{task.model_dump_json()}"
        with self._lock:
            known = self._known.get(key)
            if known is not None:
                self._known.move_to_end(key)
        if known is None:
            if not self._admitted.acquire(blocking=False):
                raise Busy("every task check is busy, and as many are waiting; retry shortly")
            try:
                known = self.prober.probe(task, eval_size, self.budget)
            except TaskRefused as exc:
                if not exc.lasting:  # a deadline missed on a busy machine: ask again next time
                    raise
                known = str(exc)
            except ProberBusy as exc:
                raise Busy(f"{exc}; retry in a few seconds") from None
            finally:
                self._admitted.release()
            with self._lock:
                self._known[key] = known
                while len(self._known) > REMEMBERED:
                    self._known.popitem(last=False)
        if isinstance(known, str):
            raise TaskRefused(known)
        return known

    def problems(self, config: RunConfig) -> list[Problem]:
        """What building ``config``'s task says is wrong with it: a task that cannot be built
        within the budget (at ``task.params``), or fewer distinct held-out problems than
        ``task.eval_size`` asks for (at ``task.eval_size``, naming how many there are). The
        default eval_size means "up to 64", not an ask for 64: such a run scores the problems
        there are, and says how many (``eval/problems``)."""
        if not probed(config.task):
            return []
        try:
            found = self.probe(config.task, config.task.eval_size)
        except TaskRefused as exc:
            return [(("task", "params"), str(exc), config.task.params)]
        short = held_out_problem(found)
        return [short] if short and not at_default_eval_size(config.task) else []

    def close(self) -> None:
        self.prober.close()


def at_default_eval_size(task: TaskConfig) -> bool:
    """Whether ``task.eval_size`` is the default (64): "up to that many", whoever wrote it (a
    client that sends every field, a clone of a run stored with its defaults filled in)."""
    return task.eval_size == TaskConfig.model_fields["eval_size"].default


def held_out_problem(found: TaskProbe) -> Problem | None:
    if found.held_out is None or found.held_out >= found.asked:
        return None
    message = (
        f"this task has {found.held_out} distinct held-out problems, fewer than the"
        f" {found.asked} asked: set task.eval_size to at most {found.held_out}, or widen the"
        " task's settings"
    )
    return ("task", "eval_size"), message, found.asked


_BY_SETTINGS: dict[tuple[int, float, float, int], TaskChecks] = {}
_BY_SETTINGS_LOCK = threading.Lock()


def for_settings(settings: Settings) -> TaskChecks:
    """This process's checks for these settings (one pool of helpers per distinct setting)."""
    key = (
        settings.task_check_slots,
        settings.task_check_wait_s,
        settings.task_check_seconds,
        settings.task_check_memory_mib,
    )
    with _BY_SETTINGS_LOCK:
        if key not in _BY_SETTINGS:
            budget = ProbeBudget(
                seconds=settings.task_check_seconds,
                memory_bytes=settings.task_check_memory_mib * 2**20,
            )
            _BY_SETTINGS[key] = TaskChecks(key[0], key[1], budget)
        return _BY_SETTINGS[key]
