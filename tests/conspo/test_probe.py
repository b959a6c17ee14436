"""Building a task under a budget (conspo.tasks.probe): the helper processes, their children's
memory cap and deadline, the held-out count, and a helper that dies."""

from __future__ import annotations

import random
import threading
import time

import psutil
import pytest

from conspo.config import TaskConfig
from conspo.tasks import make_task
from conspo.tasks.probe import (
    ProbeBudget,
    ProberBusy,
    TaskProber,
    TaskRefused,
    _ran_out_of_memory,
)


def chain_sum(**config: int) -> TaskConfig:
    return TaskConfig.model_validate(
        {"name": "reasoning_gym", "params": {"dataset": "chain_sum", "config": config}}
    )


# countdown with 7 numbers: each held-out problem takes a while to draw (200 take over 4 s)
COUNTDOWN_7 = TaskConfig.model_validate(
    {
        "name": "reasoning_gym",
        "params": {"dataset": "countdown", "config": {"min_numbers": 7, "max_numbers": 7}},
    }
)


@pytest.fixture(scope="module")
def prober():
    made = TaskProber(slots=1, wait_s=30)
    yield made
    made.close()


def test_a_probe_counts_held_out_problems_up_to_the_ask(prober: TaskProber) -> None:
    small = prober.probe(chain_sum(min_terms=2, max_terms=2, max_digits=1), 200)
    assert small.asked == 200 and small.held_out is not None and 5 < small.held_out < 40
    large = prober.probe(chain_sum(min_terms=3, max_terms=3, max_digits=3), 300)
    assert large.held_out == 300 and large.longest_prompt > 0
    # the count agrees with the task built here
    assert small.held_out == len(make_task(chain_sum(min_terms=2, max_terms=2, max_digits=1))
                                 .eval_examples(200))  # fmt: skip


def test_memory_time_and_length_budgets_refuse_in_the_child_not_here(prober: TaskProber) -> None:
    task = chain_sum()
    # word_ladder reads its word list and builds a graph on its first draw: with no headroom
    # over the child's address space at the fork, that allocation fails (a MemoryError, which
    # word_ladder wraps in a RuntimeError when it fails inside its word-list reader)
    words = TaskConfig.model_validate(
        {"name": "reasoning_gym", "params": {"dataset": "word_ladder"}}
    )
    with pytest.raises(TaskRefused, match="needs over") as caught:
        prober.probe(words, 10, ProbeBudget(memory_bytes=0))
    assert caught.value.lasting
    started = time.monotonic()
    with pytest.raises(TaskRefused, match="took over") as caught:
        prober.probe(task, 10, ProbeBudget(seconds=0.001))
    assert not caught.value.lasting  # a deadline missed may pass on a quiet machine
    assert time.monotonic() - started < 10
    long = chain_sum(min_terms=20, max_terms=20, min_digits=18, max_digits=18)
    with pytest.raises(TaskRefused, match="too long"):
        prober.probe(long, 10, ProbeBudget(max_prompt_chars=100))
    # the helper lives on after each refusal
    assert prober.probe(task, 10).held_out == 10


def test_a_memory_error_wrapped_by_the_generator_is_still_memory() -> None:
    def wrapped() -> None:
        try:
            raise MemoryError
        except MemoryError as exc:
            raise RuntimeError("Error processing words.csv content: ") from exc

    with pytest.raises(RuntimeError) as caught:
        wrapped()
    assert _ran_out_of_memory(caught.value)
    assert not _ran_out_of_memory(RuntimeError("Error processing words.csv content: "))
    # a C allocation that failed under the cap without setting an error (seen in CI)
    assert _ran_out_of_memory(SystemError("error return without exception set"))
    assert not _ran_out_of_memory(SystemError("some other internal error"))


def test_a_count_past_the_deadline_is_unknown_not_refused(prober: TaskProber) -> None:
    found = prober.probe(COUNTDOWN_7, 200, ProbeBudget(seconds=4))
    assert found.held_out is None and found.longest_prompt > 0


def test_a_helper_killed_mid_probe_is_the_machines_trouble_and_is_replaced(
    prober: TaskProber,
) -> None:
    helper = prober._free.queue[0]
    prober.probe(chain_sum(), 4)  # started and ready
    proc = helper._proc
    assert proc is not None
    # killed while it counts a slow task's held-out problems (a count that runs to its deadline)
    children: list[psutil.Process] = []

    def kill_mid_probe() -> None:
        children.extend(psutil.Process(proc.pid).children())
        proc.kill()

    killer = threading.Timer(1.5, kill_mid_probe)
    killer.start()
    started = time.monotonic()
    with pytest.raises(ProberBusy):
        prober.probe(COUNTDOWN_7, 200, ProbeBudget(seconds=30))
    killer.join()
    assert time.monotonic() - started < 20  # told when the helper died, not at its timeout
    assert children  # the probe's child was counting; it dies with its helper
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert prober.probe(chain_sum(max_terms=4), 4).held_out == 4  # a new helper
    assert helper._proc is not proc
    # one that died between checks is replaced before the next is asked
    assert helper._proc is not None
    helper._proc.kill()
    helper._proc.wait()
    assert prober.probe(chain_sum(max_terms=3), 4).held_out == 4


def test_a_held_out_search_stops_when_the_split_is_exhausted() -> None:
    task = make_task(chain_sum(min_terms=2, max_terms=2, max_digits=1))
    started = time.monotonic()
    found = task.eval_examples(10_000)
    assert 5 < len(found) < 40 and len({ex.prompt for ex in found}) == len(found)
    # the search drew its finds plus 2,000 misses in a row, not 2,000 draws per problem asked
    assert time.monotonic() - started < 60
    assert task.eval_examples(10_000) == found  # the same list every time
    assert len(task.train_prompts(random.Random(0), 8)) == 8
