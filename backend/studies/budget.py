"""A study's budget before it is submitted: runs, tokens and (from earlier runs) time.

* ``runs``: a tuned study's tuning runs (trials × tuning seeds, per tuned arm) and final runs
  (arms × tasks × seeds); a search study's trials × seeds.
* ``tokens``: an upper bound on what its runs generate for training: each run's
  steps × prompts_per_step × group_size × sampling.max_new_tokens (every rollout at its longest;
  evaluations not counted), summed. A tuned arm's trials are counted at the arm's own config,
  a search's trials at the base config: a space over ``steps`` or the sampling shape moves it.
* ``seconds``: the runs' steps × the median seconds per step of the latest runs of the same
  model and shape that have a pace (``backend.runs.progress.pace_of_like``), summed over the
  runs (the time one worker would take; runs trained side by side divide it); None while some
  config has no such earlier run.

``refusals`` holds a study to the operator's caps (``Settings.study_max_runs``,
``study_max_tokens``): a 422 naming the field to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from backend.config import Settings
from backend.runs.progress import pace_of_like
from backend.studies.spec import StudyCreate, validate_arm
from conspo.config import RunConfig


def run_tokens(config: RunConfig) -> int:
    """The most tokens ``config``'s training rollouts may generate."""
    s = config.sampling
    return config.steps * s.prompts_per_step * s.group_size * s.max_new_tokens


def study_budget(
    session: Session | None,
    body: StudyCreate,
    arms: Sequence[tuple[str, RunConfig]],
) -> dict[str, Any]:
    """``{tuning_runs, final_runs, runs, tokens, seconds, seconds_from, text}`` of a study whose
    (validated) final arm configs are ``arms`` (empty for a search study: its base config
    stands for each trial). ``session`` None: no time estimate (an anonymous check)."""
    tuning_runs, final_runs = body.planned_runs()
    planned: list[tuple[RunConfig, int]] = []  # a config and how many runs have its shape
    if body.search is not None:
        base, _ = validate_arm(body.config, {}, ())
        if base is not None:
            planned.append((base, final_runs))
    else:
        planned += [(config, len(body.seeds)) for _, config in arms]
        by_name = dict(arms)
        for arm in body.arms:
            if arm.tune is not None and arm.name in by_name:
                planned.append((by_name[arm.name], arm.tune.trials * len(body.tuning_seeds)))
    tokens = sum(run_tokens(config) * n for config, n in planned)
    seconds: float | None = None
    paced = 0
    if session is not None and planned:
        seconds = 0.0
        for config, n in planned:
            pace = pace_of_like(session, config.model_dump(mode="json"))
            if pace is None:
                seconds = None
                break
            seconds += pace["seconds_per_step"] * config.steps * n
            paced += pace["runs"]
    runs = tuning_runs + final_runs
    text = f"{runs} runs"
    if tuning_runs:
        text += f" ({tuning_runs} tuning + {final_runs} final)"
    text += f", ≤ {tokens:,} generated tokens (steps × prompts × rollouts × max_new_tokens)"
    if seconds is not None:
        text += f", ~{_duration(seconds)} of training one run at a time (the pace of {paced}"
        text += " earlier runs of the same model and shape)"
    elif session is not None:
        text += "; no earlier run of this model and shape to time it by"
    return {
        "tuning_runs": tuning_runs,
        "final_runs": final_runs,
        "runs": runs,
        "tokens": tokens,
        "seconds": seconds,
        "text": text,
    }


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def refusals(body: StudyCreate, budget: dict[str, Any], settings: Settings) -> list[dict[str, Any]]:
    """The 422 errors of a budget over the operator's caps (none when within them)."""
    errors = []
    if budget["runs"] > settings.study_max_runs:
        where = "arms" if body.tuned else "seeds"  # a tuned study: its trials, most often
        errors.append(
            {
                "type": "value_error",
                "loc": ("body", where),
                "msg": f"{budget['text']}: more than this server's {settings.study_max_runs}"
                " runs a study (CONSPO_STUDY_MAX_RUNS)",
            }
        )
    if budget["tokens"] > settings.study_max_tokens:
        errors.append(
            {
                "type": "value_error",
                "loc": ("body", "config", "steps"),
                "msg": f"{budget['text']}: more than this server's {settings.study_max_tokens:,}"
                " tokens a study (CONSPO_STUDY_MAX_TOKENS)",
            }
        )
    return errors
