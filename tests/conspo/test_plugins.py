"""Users' own code as plugins (conspo.plugins): CONSPO_PLUGINS modules and files and the
``conspo.plugins`` entry points register like built-ins, each process says what it loaded, and
a plugin that fails is named, never half-registered, and never shadows a built-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from conspo import plugins
from conspo.config import RunConfig
from conspo.registry import REWARDS, TASKS, all_registries

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugins" / "conspo_example_plugin"

SHOUTY = """
from conspo.registry import register_reward
from conspo.rewards.base import RewardParams

class ShoutyParams(RewardParams):
    bonus: float = 1.0

@register_reward("shouty", params=ShoutyParams, description="Rewards exclamation marks.")
def shouty(completion, example, context, params):
    return params.bonus * completion.count("!")
"""

HALF_THERE = """
from conspo.registry import register_reward
from conspo.rewards.base import RewardParams

@register_reward("half_there", params=RewardParams, description="Registered, then it fails.")
def half_there(completion, example, context, params):
    return 0.0

raise RuntimeError("the plugin's own bug")
"""

SHADOW = """
from conspo.registry import register_task
from conspo.tasks.arith import ArithParams, ArithTask

@register_task("arith", params=ArithParams, description="Someone else's arith.")
class MyArith(ArithTask):
    pass
"""


@pytest.fixture
def plugin_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """CONSPO_PLUGINS set by the test, loaded afresh, and every registration taken back after."""
    plugins.reset()
    yield monkeypatch
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    plugins.reset()


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_a_plugin_file_registers_and_a_failing_one_is_named_and_taken_back(
    plugin_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shouty = write(tmp_path / "shouty.py", SHOUTY)
    broken = write(tmp_path / "broken.py", HALF_THERE)
    plugin_env.setenv(plugins.ENV_VAR, f"{shouty}, {broken} no_such_module 9lives")

    assert "shouty" in REWARDS.names()  # the first lookup loads them
    assert REWARDS.origin("shouty") == str(shouty) and REWARDS.origin("verifier") is None
    assert "half_there" not in REWARDS.names()  # registered before the failure: taken back
    assert REWARDS.origin("half_there") is None
    report = plugins.report()
    assert [p["name"] for p in report["loaded"]] == [str(shouty)]
    assert report["loaded"][0]["provides"] == {"reward": ["shouty"]}
    failed = {p["name"]: p["error"] for p in report["failed"]}
    assert failed[str(broken)] == "RuntimeError: the plugin's own bug (broken.py:9)"
    assert failed["no_such_module"] == "ModuleNotFoundError: No module named 'no_such_module'"
    assert "neither a module name" in failed["9lives"]
    # A config names the plugin's reward like a built-in one, with its params checked.
    config = RunConfig.model_validate({"rewards": [{"name": "shouty", "params": {"bonus": 2}}]})
    (reward,) = (r for r in config.rewards if r.name == "shouty")
    assert reward.typed("params", REWARDS.get("shouty").params).bonus == 2
    with pytest.raises(ValueError, match="bonus"):
        RunConfig.model_validate({"rewards": [{"name": "shouty", "params": {"bonus": "x"}}]})
    # Loaded once per process: later lookups import nothing again.
    assert len(plugins.plugins()) == 4


def test_a_plugin_cannot_shadow_a_built_in(plugin_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shadow = write(tmp_path / "shadow.py", SHADOW)
    plugin_env.setenv(plugins.ENV_VAR, str(shadow))
    assert TASKS.get("arith").cls.__module__ == "conspo.tasks.arith"
    (failed,) = plugins.failed()
    assert "task 'arith' is already registered" in (failed.error or "")


def test_the_example_package_s_task_and_reward_resolve_by_module_name(
    plugin_env: pytest.MonkeyPatch,
) -> None:
    plugin_env.syspath_prepend(str(EXAMPLE))
    plugin_env.setenv(plugins.ENV_VAR, "conspo_example_plugin")
    config = RunConfig.model_validate(
        {
            "task": {"name": "count_letter", "params": {"random_words": True}},
            "rewards": [{"name": "verifier"}, {"name": "brevity", "params": {"limit": 10}}],
        }
    )
    used = {loc: registry.origin(name) for loc, registry, name in config.registered_at()}
    assert used[("task", "name")] == used[("rewards", 1, "name")] == "conspo_example_plugin"
    assert used[("rewards", 0, "name")] is None and used[("kind",)] is None
    registered = TASKS.get("count_letter")
    task = registered.cls(config.task.typed("params", registered.params))
    example = task.eval_examples(1)[0]
    assert task.verify(f" {example.answer} times", example) == 1.0
    assert task.verify("none", example) == 0.0


def test_every_registry_loads_the_plugins(plugin_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Whichever registry is looked up first, every registry sees the plugins."""
    shouty = write(tmp_path / "shouty_again.py", SHOUTY)
    plugin_env.setenv(plugins.ENV_VAR, str(shouty))
    for registry in all_registries():
        registry.names()
    assert REWARDS.origin("shouty") == str(shouty)


def test_an_installed_entry_point_is_found_without_any_setting(tmp_path: Path) -> None:
    """What ``pip install -e examples/plugins/conspo_example_plugin`` leaves for
    importlib.metadata (a dist-info with the entry point, the package on the path), in a
    fresh interpreter with no CONSPO_PLUGINS: the platform finds it by the entry point alone."""
    site = tmp_path / "site"
    dist = site / "conspo_example_plugin-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: conspo-example-plugin\nVersion: 0.1.0\n"
    )
    (dist / "entry_points.txt").write_text("[conspo.plugins]\nexample = conspo_example_plugin\n")
    env = {k: v for k, v in os.environ.items() if k != plugins.ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(EXAMPLE), str(ROOT)])
    code = (
        "import json; from conspo import plugins; from conspo.registry import TASKS;"
        " TASKS.names(); print(json.dumps(plugins.report()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    (loaded,) = json.loads(out.stdout)["loaded"]
    assert loaded["name"] == "example" and loaded["source"] == "entry point"
    assert loaded["distribution"] == "conspo-example-plugin" and loaded["version"] == "0.1.0"
    assert loaded["provides"] == {
        "environment": ["nim"],
        "reward": ["brevity", "few_turns"],
        "task": ["count_letter", "nim_games"],
    }
