"""The metric catalogue is complete and truthful: every key a run logs is described in it, every
key it describes is logged by some run, and its charts, sections and flags hold together."""

from __future__ import annotations

import pytest

from conspo import metrics as M
from conspo.config import RunConfig
from conspo.registry import objective_names
from conspo.sink import MemorySink
from conspo.training.trainer import train

CATALOGUE = M.catalogue()
KEYS = {m.key for m in CATALOGUE.metrics}


def test_keys_charts_and_sections_hold_together() -> None:
    assert len(KEYS) == len(CATALOGUE.metrics), "a key is described twice"
    charts = {c.id: c for c in CATALOGUE.charts}
    sections = {s.id for s in CATALOGUE.sections}
    assert len(charts) == len(CATALOGUE.charts) and len(sections) == len(CATALOGUE.sections)
    for m in CATALOGUE.metrics:
        assert m.key.count("/") >= 1 and m.key == m.key.lower(), f"{m.key}: namespace/name"
        assert m.help and m.label and m.unit, m.key
        assert m.chart is None or m.chart in charts, f"{m.key}: unknown chart {m.chart}"
    for chart in CATALOGUE.charts:
        assert chart.section in sections, chart.id
        drawn = [m for m in CATALOGUE.metrics if m.chart == chart.id]
        # A metric chart draws catalogue metrics; a rollout view draws none.
        assert bool(drawn) == (chart.kind in ("line", "stack")), chart.id
    assert set(CATALOGUE.key_metrics) <= KEYS and CATALOGUE.rollouts_axis in KEYS
    assert set(M.SEPARATION_KEYS) <= KEYS
    assert not set(CATALOGUE.legacy_keys) & KEYS and set(CATALOGUE.legacy_keys.values()) <= KEYS


def _logged_keys(algorithm: str, params: dict, model_store, tmp_path, **extra: object) -> set[str]:
    evaluation = {"every": 0, "pass_k": 2, **extra.pop("eval", {})}  # type: ignore[dict-item]
    sampling = extra.pop("sampling", {})
    cfg = RunConfig.model_validate({
        "algorithm": algorithm,
        "params": params,
        "steps": 2,
        "model": {"name": "tiny"},
        "task": {"name": "arith", "eval_size": 4},
        **extra,
        # Longer than DAPO's default overlong buffer (8), which must leave some length unpenalised.
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 10, **sampling},
        "optim": {"mini_batches": 2},
        "eval": evaluation,
        "checkpoint": {"every": 0},
    })  # fmt: skip
    sink = MemorySink()
    train(cfg, sink, workdir=tmp_path / algorithm, model_store=model_store)
    return set().union(*(record.metrics for record in sink.steps.values()))


@pytest.fixture(scope="module")
def logged(model_store, tmp_path_factory) -> dict[str, set[str]]:
    """Keys logged by two steps (with a final evaluation) of every registered objective."""
    tmp = tmp_path_factory.mktemp("catalogue-runs")
    return {name: _logged_keys(name, {}, model_store, tmp) for name in objective_names()}


def test_every_logged_key_is_in_the_catalogue(logged) -> None:
    for algorithm, keys in logged.items():
        # A key a config names (reward/<name>) is described by its pattern entry.
        lacking = {k for k in keys - KEYS if M.pattern(k) is None}
        assert not lacking, f"{algorithm} logs keys the catalogue lacks: {lacking}"


# Keys an objective logs only from a later point of a run than two default steps reach: RRPO's
# agreement with the verifier, once its head is frozen (after params.anchor_steps = 2). The
# catalogue test below has a run that reaches it log them.
LATER_KEYS = {M.RRPO_ANCHOR_AUC, M.RRPO_ANCHOR_GAP}


def test_objectives_declare_exactly_the_objective_keys_they_log(logged) -> None:
    by_objective = {m.key for m in CATALOGUE.metrics if m.logged_by == "objective"}
    assert set(CATALOGUE.objective_metrics) == set(objective_names())
    for algorithm, keys in logged.items():
        declared = set(CATALOGUE.objective_metrics[algorithm])
        assert declared <= by_objective, f"{algorithm} declares keys not marked 'objective'"
        assert keys & by_objective == declared - LATER_KEYS, algorithm


def test_keys_every_run_logs_are_logged_by_every_objective(logged) -> None:
    always = {m.key for m in CATALOGUE.metrics if m.logged_by == "every run" and not m.when}
    for algorithm, keys in logged.items():
        assert always <= keys, f"{algorithm} does not log {always - keys}"


# Job kinds: every kind's two steps from its registration's example (the job_kind_runs fixture,
# conftest.py); that each logs exactly the keys it declares is tests/conspo/test_registries.py's.


def test_every_catalogue_key_is_logged_by_some_run(
    logged, job_kind_runs, model_store, tmp_path
) -> None:
    # The KL to a reference model is logged only when one is loaded (beta > 0), the KL in the
    # reward only by runs that put it there (kl_in_reward > 0), best-of-N only where asked.
    with_reference = _logged_keys(
        "grpo", {"beta": 0.1, "kl_in_reward": 0.1}, model_store, tmp_path,
        eval={"best_of": "verifier"},
    )  # fmt: skip
    # Tool use is logged by runs with tools (the calculator: no sandbox, nothing to install).
    with_tools = _logged_keys("grpo", {}, model_store, tmp_path / "tools", tools=["calculator"])
    # Episodes are logged by runs that play an environment; this one generates asynchronously.
    game = {"name": "environment", "eval_size": 4, "params": {"environment": "guess_number"}}
    with_env = _logged_keys(
        "grpo", {}, model_store, tmp_path / "env", task=game, sampling={"max_staleness": 1}
    )
    # RRPO's head frozen after one step, on a model that gets some sums right (both anchor sets).
    with_anchors = _logged_keys(
        "rrpo", {"anchor_steps": 1, "min_anchors": 1}, model_store, tmp_path / "anchors",
        model={"name": "tiny-arith"},
    )  # fmt: skip
    assert with_anchors >= LATER_KEYS
    by_kinds = [run.logged for run in job_kind_runs.values()]
    # The system readings come from a sampler on the clock, on the steps a sample fell in: these
    # runs' steps are too short for one; tests/conspo/test_system.py has a run log them.
    system = {k for k in KEYS if k.startswith("system/")}
    never = KEYS - system - with_reference - with_tools - with_env - with_anchors
    never -= set().union(*logged.values(), *by_kinds)
    assert not never, f"catalogue keys no run logs: {never}"
    for key in (M.KL, M.KL_IN_REWARD):
        assert key in with_reference and not any(key in keys for keys in logged.values())
    tool_keys = {m.key for m in CATALOGUE.metrics if m.chart and m.chart.startswith("tool")}
    assert tool_keys <= with_tools and not any(tool_keys & keys for keys in logged.values())
    env_keys = {m.key for m in CATALOGUE.metrics if m.key.startswith("env/")}
    assert env_keys <= with_env and not any(env_keys & keys for keys in logged.values())
    async_keys = {m.key for m in CATALOGUE.metrics if m.key.startswith("async/")}
    assert async_keys <= with_env and not any(async_keys & keys for keys in logged.values())
