"""A run that plays an environment in a real Chromium (see conftest.py for the stack): the rollout
viewer shows each sampled rollout's episode turn by turn (the environment's first observation,
then each action, the environment's answer, the turn's reward and done), a turn that failed the
episode in red, a summary line per episode, hostile text as text, and a rollout without an
episode as before.

The episodes are written the way the worker's sink writes them (``RolloutRecord.episode`` from
``conspo.sink.episode_json``, through ``backend.storage.writes``) into the server's database: the
tiny model plays no turn within a few tokens, and its text is never hostile."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy.orm import Session

from backend.db import make_engine
from backend.storage.writes import StepPoints, write_points
from conspo.environments.base import Episode, Turn
from conspo.sink import RolloutRecord, episode_json
from tests.ui.conftest import fake_metrics, fake_rollouts

pytestmark = pytest.mark.browser

SCRIPT = "<script>window.__xss = 1</script>"
IMG = '<img src=x onerror="window.__xss = 2">'
START = "I am thinking of a whole number between 1 and 8. Guess it."
WON = Episode(
    turns=(
        Turn(f"I guess {SCRIPT}", f"{IMG} is not a number.", 0.0, False, 0.01),
        Turn("4", "4 is wrong: my number is higher.", 0.0, False, 0.01, cut_chars=12),
        Turn("6", "6 is right!", 1.0, True, 0.01),
    ),
    first_observation=f"{START} {SCRIPT}",
)
FAILED = Episode(
    turns=(Turn("3", "", 0.0, True, 0.5, error="step raised ValueError: <b>boom</b>"),),
    failure="step raised ValueError: <b>boom</b>",
    first_observation=START,
)
CUT = Episode(
    turns=tuple(Turn(str(g), f"{g} is wrong.", 0.0, False, 0.01) for g in (1, 2, 3)),
    first_observation=START,
    truncated=True,
)
CONFIG = {
    "algorithm": "grpo",
    "steps": 2,
    "model": {"name": "tiny"},
    "task": {
        "name": "environment",
        "params": {"environment": "guess_number", "environment_params": {"high": 8}},
    },
    "environment": {"max_turns": 3},
    "sampling": {"max_new_tokens": 24},
}


@pytest.fixture(scope="module")
def episode_run(ui_server: Any) -> dict[str, Any]:
    database = ui_server.data_dir / "conspo.db"
    if not database.exists():
        pytest.skip("the episodes are written into the test server's own database")
    run = ui_server.external_run(
        f"ui-episodes-{uuid.uuid4().hex[:6]}", CONFIG, algorithm="grpo", total_steps=2
    )
    steps = [{"step": s, "metrics": fake_metrics(s)} for s in (1, 2)]
    rollouts = [r for s in (1, 2) for r in fake_rollouts(s)]
    ui_server.api(
        "POST",
        f"/api/runs/{run['id']}/log",
        json={"steps": steps, "rollouts": rollouts, "status": "succeeded"},
    )
    played = [(WON, 1.0), (FAILED, 0.0), (CUT, 0.0), (None, 0.0)]
    records = [
        RolloutRecord(
            0,
            i,
            reward,
            -0.5,
            20,
            False,
            START,
            f"completion {i}",
            None if episode is None else episode_json(episode),
        )  # fmt: skip
        for i, (episode, reward) in enumerate(played)
    ]
    engine = make_engine(f"sqlite:///{database}")
    try:
        with Session(engine) as session:
            write_points(session, run["id"], [StepPoints(2, {}, rollouts=records)])
            session.commit()
    finally:
        engine.dispose()
    return run


def row(page: Any, index: int) -> Any:
    return page.locator("#rollout-body tr").nth(index)


def test_the_rollout_viewer_shows_each_episode_turn_by_turn(
    page: Any, shot: Any, ui_server: Any, episode_run: Any
) -> None:
    page.goto(f"{ui_server.url}/runs/{episode_run['id']}")
    page.wait_for_selector("#rollout-body .episode")
    won = row(page, 0).locator(".episode")
    assert won.locator(".episode-summary").text_content() == "3 turns · won · total reward 1"
    parts = won.locator(":scope > *").evaluate_all("els => els.map(e => e.className)")
    assert parts == ["episode-summary", "episode-first", *["episode-turn"] * 3]
    assert won.locator(".episode-first pre").text_content() == f"{START} {SCRIPT}"
    actions = won.locator(".episode-action pre").all_text_contents()
    assert actions == [f"I guess {SCRIPT}", "4", "6"]
    answers = won.locator(".episode-observation pre").all_text_contents()
    assert answers == [f"{IMG} is not a number.", "4 is wrong: my number is higher.", "6 is right!"]
    assert "12 chars cut" in won.locator(".episode-observation .turn-label").nth(1).text_content()
    metas = won.locator(".episode-meta").all_text_contents()
    assert metas == ["reward 0 · not done", "reward 0 · not done", "reward 1 · done"]
    assert "✓ correct" in row(page, 0).inner_text()

    failed = row(page, 1).locator(".episode")
    assert failed.locator(".episode-summary").text_content() == "1 turn · failed · total reward 0"
    error = failed.locator(".episode-turn.failed .episode-error")
    assert error.text_content() == "step raised ValueError: <b>boom</b>"
    assert error.evaluate("e => getComputedStyle(e).color") == "rgb(220, 38, 38)"  # --danger
    assert failed.locator(".episode-observation").count() == 0
    cut = row(page, 2).locator(".episode-summary")
    assert cut.text_content() == "3 turns · cut · total reward 0"

    # a rollout without an episode shows its completion as before
    assert row(page, 3).locator(".episode").count() == 0
    assert row(page, 3).locator("td.text").nth(1).text_content() == "completion 3"

    # hostile text is text: shown as written, never parsed, never run
    assert page.locator("#rollout-body script, #rollout-body img, #rollout-body b").count() == 0
    page.wait_for_timeout(500)  # an injected image would have failed to load by now
    assert page.evaluate("window.__xss === undefined")
    shot(page, "run_episodes")
