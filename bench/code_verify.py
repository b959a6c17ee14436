"""What verifying a batch of code-task rollouts costs: 64 completions checked one sandbox at a
time (``verify`` alone) vs the batch handed to ``prefetch`` first (``CHECK_WORKERS`` sandboxes at
once), as ``score_rollouts`` does.

The batch: 16 level-2 problems, each with its reference, a wrong function, a function with a
syntax error and one that sleeps 0.05 s before defining the reference (slow but right): every
completion is one sandbox run. A
fresh task per measurement, so nothing is cached across them; the two ways interleaved, so a
machine that gets busier mid-run slows both alike. Prints every repeat and the medians, per
verification: wall seconds (the batch's wall time / 64), the sandboxes' CPU seconds (every
reaped child: bwrap, the interpreter, what it forked) and this process's own CPU seconds
(building programs, parsing reports).

    PYTHONPATH=. .venv/bin/python bench/code_verify.py --repeats 7
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time

from conspo.config import TaskConfig
from conspo.sandbox import sandbox_available
from conspo.tasks import Example, make_task
from conspo.tasks.code import CodeTask
from conspo.tasks.code_checks import CHECK_WORKERS

BATCH = 64


def batch(task: CodeTask) -> tuple[list[str], list[Example]]:
    problems = task.train_prompts(random.Random(0), BATCH // 4)
    completions, examples = [], []
    for ex in problems:
        spec = ex.answer.removeprefix("```python\n").removesuffix("```")
        name = ex.data["function"]
        wrong = spec.replace(f"def {name}(", f"def _{name}(") + f"def {name}(*a):\n    return 0\n"
        slow = f"import time\ntime.sleep(0.05)\n{spec}"
        broken = f"```python\ndef {name}(:\n    return\n```"
        completions += [ex.answer, f"```python\n{wrong}```", broken, f"```\n{slow}```"]
        examples += [ex] * 4
    return completions, examples


def measure(prefetch: bool) -> tuple[float, float, float, float]:
    """(wall, sandbox CPU, own CPU) per verification, and the share verified correct."""
    task = make_task(TaskConfig(name="code", params={"difficulty": 2}))
    assert isinstance(task, CodeTask)
    completions, examples = batch(task)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    if prefetch:
        task.prefetch(completions, examples)
    scores = [task.verify(c, ex) for c, ex in zip(completions, examples, strict=True)]
    wall = time.perf_counter() - started
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own_after = resource.getrusage(resource.RUSAGE_SELF)
    sandbox_cpu = (children_after.ru_utime + children_after.ru_stime) - (
        children.ru_utime + children.ru_stime
    )
    own_cpu = (own_after.ru_utime + own_after.ru_stime) - (own.ru_utime + own.ru_stime)
    return wall / BATCH, sandbox_cpu / BATCH, own_cpu / BATCH, sum(scores) / BATCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    print("sandbox:", sandbox_available().reason, f"| workers: {CHECK_WORKERS}")
    ways = {"one by one": False, "prefetch": True}
    timings: dict[str, list[tuple[float, float, float, float]]] = {way: [] for way in ways}
    print(f"{'repeat':>6} {'way':>11} {'wall/verif':>11} {'sandbox cpu':>12} {'own cpu':>8} right")
    for repeat in range(repeats):
        order = list(ways) if repeat % 2 == 0 else list(ways)[::-1]
        for way in order:
            wall, sandbox_cpu, own_cpu, right = measure(ways[way])
            timings[way].append((wall, sandbox_cpu, own_cpu, right))
            print(
                f"{repeat:>6} {way:>11} {wall:>11.4f} {sandbox_cpu:>12.4f} {own_cpu:>8.4f}"
                f" {right:.2f}"
            )
    for way, rows in timings.items():
        wall, sandbox_cpu, own_cpu = (statistics.median(r[i] for r in rows) for i in range(3))
        print(
            f"median {way:>11}: wall {wall:.4f} s, sandbox cpu {sandbox_cpu:.4f} s,"
            f" own cpu {own_cpu:.4f} s per verification ({BATCH} a batch)"
        )


if __name__ == "__main__":
    main()
