"""The demo study (``make run`` queues it) run headless, and its verdict line.

    PYTHONPATH=. .venv/bin/python bench/demo_study.py [--seeds 0 1 2 3 4] [--steps N]
        [--arms grpo conspo conspo-linear] [--jobs 2] [--out demo_study.json]

Every (arm, seed) of ``conspo_lab.cli_server.demo_spec()`` trains in-process through
``conspo.training.trainer.train`` with a ``MemorySink`` (in a worker process of its own with one
torch thread, ``--jobs`` at a time), exactly the config the platform's worker would get (the arm's
overrides validated by ``backend.studies.spec.validate_arm``, the seed set as the study sets
it). Each run's objective is reduced as the study page reduces it
(``backend.studies.service.reduce_series``) and the verdict comes from
``backend.studies.stats.summarise``: the line the study page leads with.

Printed: per run its objective and wall / CPU seconds; per arm the mean with its 95% t CI;
the verdict lines; wall and CPU seconds per run (min / median). Finished runs are appended to
``--out`` at once and not run again, so an interrupted study resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _one_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def run_one(config_json: dict[str, Any], metric: str) -> dict[str, Any]:
    """Train one (arm, seed) config; its metric series and its wall / CPU seconds."""
    from conspo.config import RunConfig
    from conspo.sink import MemorySink
    from conspo.training.trainer import train

    config = RunConfig.model_validate(config_json)
    sink = MemorySink()
    wall, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as workdir:
        train(config, sink, workdir=workdir)
    points = [(s, r.metrics[metric]) for s, r in sorted(sink.steps.items()) if metric in r.metrics]
    return {
        "steps": [s for s, _ in points],
        "values": [v for _, v in points],
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
    }


def main() -> None:
    from backend.studies import stats
    from backend.studies.service import reduce_series
    from backend.studies.spec import StudyCreate, validate_arm
    from conspo_lab.cli_server import demo_spec

    spec = StudyCreate.model_validate(demo_spec())
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=spec.seeds)
    parser.add_argument("--arms", nargs="+", default=[a.name for a in spec.arms])
    parser.add_argument("--steps", type=int, default=None, help="override the config's steps")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("demo_study.json"))
    args = parser.parse_args()

    objective = spec.objective
    base = dict(spec.config, **({"steps": args.steps} if args.steps else {}))
    done: dict[str, dict[str, Any]] = {}
    if args.out.exists():
        done = {f"{r['arm']}/{r['seed']}": r for r in map(json.loads, args.out.open())}
    todo = []
    for arm in (a for a in spec.arms if a.name in args.arms):
        config, problems = validate_arm(base, arm.overrides, ("demo", arm.name))
        assert config is not None, problems
        for seed in args.seeds:
            if f"{arm.name}/{seed}" not in done:
                todo.append((arm.name, seed, config.model_copy(update={"seed": seed})))
    # seed-major, arms interleaved (as a study releases them): a cut-short run still pairs
    todo.sort(key=lambda t: (args.seeds.index(t[1]), args.arms.index(t[0])))
    print(f"{len(done)} runs done before, {len(todo)} to run, {args.jobs} at a time", flush=True)
    with ProcessPoolExecutor(args.jobs, initializer=_one_thread) as pool:
        futures = {
            pool.submit(run_one, config.model_dump(mode="json"), objective.metric): (arm, seed)
            for arm, seed, config in todo
        }
        for future in as_completed(futures):
            arm, seed = futures[future]
            result = {"arm": arm, "seed": seed, **future.result()}
            result["objective"] = reduce_series(
                result["steps"], result["values"], objective.reduce, objective.k
            )
            done[f"{arm}/{seed}"] = result
            with args.out.open("a") as f:
                f.write(json.dumps(result) + "\n")
            print(
                f"  {arm:>14} seed {seed}: {objective.metric} {objective.reduce} = "
                f"{result['objective']:.4f}  ({result['wall_s']:.0f} s wall, "
                f"{result['cpu_s']:.0f} s CPU)",
                flush=True,
            )

    by_arm: dict[str, dict[int, float]] = {a: {} for a in args.arms}
    for r in done.values():
        if r["arm"] in by_arm and r["seed"] in args.seeds and r["objective"] is not None:
            by_arm[r["arm"]][r["seed"]] = r["objective"]
    summary = stats.summarise(
        by_arm,
        spec.baseline or args.arms[0],
        direction=objective.direction,
        scale=objective.scale or 1.0,
        unit=objective.unit or "",
        effect=objective.effect,
    )
    scale = objective.scale or 1.0
    print(f"\nobjective: {objective.metric}, {objective.reduce} (k = {objective.k}), × {scale:g}")
    for name, arm in summary.arms.items():
        ci = f"[{arm.ci_t[0] * scale:.1f}, {arm.ci_t[1] * scale:.1f}]" if arm.ci_t else "–"
        mean = "–" if arm.mean is None else f"{arm.mean * scale:.1f}"
        print(f"  {name:>14}: {mean} {ci} (n = {arm.n})")
    print("\nverdict:")
    for line in summary.verdict:
        print(f"  {line}")
    walls = [r["wall_s"] for r in done.values()]
    cpus = [r["cpu_s"] for r in done.values()]
    if walls:
        print(
            f"\nper run: wall min {min(walls):.0f} s, median {statistics.median(walls):.0f} s; "
            f"CPU min {min(cpus):.0f} s, median {statistics.median(cpus):.0f} s "
            f"({len(walls)} runs)"
        )


if __name__ == "__main__":
    main()
