"""TextArena's single-player games as registered environments (pip ``textarena``, 0.7.4).

Those that run offline (checked with the network blocked: the import and each game's start
and turns make no connection): GuessTheNumber, Mastermind, TowerOfHanoi, Minesweeper,
FrozenLake and Sudoku, each registered as ``ta_<game>`` with its TextArena variants as a
parameter. Hangman and Wordle are left out: they fetch NLTK word lists when they start.

Each game is TextArena's raw environment (its ``-raw`` id: no wrapper), played as its default
wrappers would: an action with no square bracket is put inside one (``ActionFormattingWrapper``),
and each observation is the game's new messages since the last (the first: its instructions and
board), the echo of the player's own action left out. The game is seeded with the example's
game seed (``game_seed``), so the environment task's held-out seeds are held-out games.
TextArena scores at the end only: each turn earns 0 and the final reward is the game's (1 for a
win; otherwise the game's measure of progress, e.g. the fraction of a puzzle solved; a second
invalid move in a row ends the game). When the last turn's messages are empty, the game's
reason for ending is the observation.

TextArena draws from Python's global ``random`` (it seeds it at reset). So that two episodes
never draw from one sequence, and the rest of the process's draws are not moved, each episode
keeps its own state of the global generator and swaps it in, under a lock, only for its calls.
The import (about 1.5 s) happens when the first game is built, never at registration.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Literal

from pydantic import Field

from conspo.environments.base import EnvironmentParams, EnvNeeds, StepResult, game_seed
from conspo.registry import register_environment
from conspo.tasks.base import Example

VERSION = "0.7.4"
_GLOBAL_RANDOM = threading.Lock()


class TextArenaGame:
    """One TextArena game (``env_id``) played through the protocol."""

    def __init__(self, env_id: str, example: Example) -> None:
        try:
            import textarena  # type: ignore[import-untyped]
        except ImportError as exc:
            raise ImportError(
                f"TextArena games need the textarena package (pip install textarena=={VERSION})"
            ) from exc
        self._player_action = textarena.ObservationType.PLAYER_ACTION
        self.seed = game_seed(example)
        self.game = textarena.make(env_id=f"{env_id}-raw")
        self.reward: float | None = None
        self._random_state: Any = None  # the game's own state of the global generator

    def reset(self) -> str:
        return self._with_own_random(self._reset)

    def step(self, action_text: str) -> StepResult:
        return self._with_own_random(lambda: self._step(action_text))

    def final_reward(self) -> float | None:
        return self.reward

    def close(self) -> None:
        pass  # a TextArena game holds nothing (its close() only reports the rewards)

    def _reset(self) -> str:
        self.game.reset(num_players=1, seed=self.seed)
        return self._new_messages()

    def _step(self, action_text: str) -> StepResult:
        action = action_text if "[" in action_text or "]" in action_text else f"[{action_text}]"
        done, info = self.game.step(action=action)
        observation = self._new_messages()
        details: dict[str, Any] = dict(info or {})
        if done:
            rewards, game_info = self.game.close()
            self.reward = None if rewards is None else rewards.get(0)
            details.update((game_info or {}).get(0, {}))
            observation = observation or str(details.get("reason") or "")
        return StepResult(observation, 0.0, bool(done), details)

    def _new_messages(self) -> str:
        _, messages = self.game.get_observation()
        kept = [text for _, text, kind in messages or [] if kind != self._player_action]
        return "\n".join(text.strip("\n") for text in kept)

    def _with_own_random(self, call: Any) -> Any:
        with _GLOBAL_RANDOM:
            outside = random.getstate()
            if self._random_state is not None:
                random.setstate(self._random_state)
            try:
                return call()
            finally:
                self._random_state = random.getstate()
                random.setstate(outside)


def _register(name: str, game: str, variants: tuple[str, ...], max_turns: int) -> None:
    """Register game ``game`` (its TextArena variants ``variants``, the first the default) as
    environment ``name``."""
    variant_type: Any = Literal[variants]

    class Params(EnvironmentParams):
        variant: variant_type = Field(
            variants[0], description=f"The TextArena variant of {game}: its size, its turns."
        )

    Params.__name__ = Params.__qualname__ = f"{game}Params"

    class Game(TextArenaGame):
        def __init__(self, params: Any, example: Example, seed: int) -> None:
            super().__init__(params.variant, example)

    Game.__name__ = Game.__qualname__ = f"{game}Game"
    register_environment(
        name,
        params=Params,
        description=f"TextArena's {game} (single player, offline); the game's reward at the"
        " end: 1 for a win.",
        # the game's own turn limit, with room for one invalid move retried after each turn
        needs=EnvNeeds(max_turns=2 * max_turns),
    )(Game)


# (environment, TextArena game, its variants (the first the default), the most turns of any)
GAMES: tuple[tuple[str, str, tuple[str, ...], int], ...] = (
    ("ta_guess_the_number", "GuessTheNumber",
     ("GuessTheNumber-v0", "GuessTheNumber-v0-hardcore"), 10),
    ("ta_mastermind", "Mastermind",
     ("Mastermind-v0", "Mastermind-v0-hard", "Mastermind-v0-extreme"), 50),
    ("ta_tower_of_hanoi", "TowerOfHanoi",
     ("TowerOfHanoi-v0", "TowerOfHanoi-v0-medium", "TowerOfHanoi-v0-hard",
      "TowerOfHanoi-v0-hardcore", "TowerOfHanoi-v0-extreme"), 254),
    ("ta_minesweeper", "Minesweeper",
     ("Minesweeper-v0", "Minesweeper-v0-small", "Minesweeper-v0-medium", "Minesweeper-v0-hard"),
     100),
    ("ta_frozen_lake", "FrozenLake",
     ("FrozenLake-v0", "FrozenLake-v0-random", "FrozenLake-v0-hardcore"), 100),
    ("ta_sudoku", "Sudoku",
     ("Sudoku-v0", "Sudoku-v0-very-easy", "Sudoku-v0-easy", "Sudoku-v0-medium",
      "Sudoku-v0-hard"), 100),
)  # fmt: skip

for _name, _game, _variants, _max_turns in GAMES:
    _register(_name, _game, _variants, _max_turns)
