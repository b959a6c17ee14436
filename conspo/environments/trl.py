"""A TRL ``environment_factory`` class, run unchanged (TRL 1.16's ``GRPOTrainer``).

TRL's contract, followed here: the class is built with no argument once per rollout;
``reset(**row)`` is given the dataset row (here the example: ``prompt``, ``answer`` and its
``data``; only the names its signature takes, unless it takes ``**kwargs``) and returns None or
a string appended to the prompt; every other public method (not starting with ``_``, other than
``reset`` and ``get_reward``) is a tool the model may call, described to it by the schema of its
signature and Google-style docstring (``tool_schemas``, what a chat template's ``tools`` takes);
``get_reward()``, when defined, is the reward the environment owns, read once at the end.

How a turn's text names calls: the format chat templates with tools use (Qwen, Hermes,
SmolLM's), one JSON object per call inside ``<tool_call>…</tool_call>``::

    <tool_call>{"name": "guess", "arguments": {"number": 42}}</tool_call>

Each call's result (a tool that raises, an unknown tool or unreadable JSON gives
``{"error": "..."}``, as TRL does: the model's mistake, not the environment's fault) is the
observation, one ``<tool_response>…</tool_response>`` block per call, and also in
``info["tool_results"]`` as TRL's tool messages (``{"name", "content"}``) for a template that
renders tool turns. A turn with no call ends the episode, as a TRL rollout ends when the model
answers without one. An async method (tool or ``get_reward``) is run to completion.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from typing import Any

from pydantic import Field, field_validator

from conspo.environments.base import EnvironmentParams, EnvNeeds, StepResult
from conspo.environments.targets import check_target, load_class
from conspo.registry import register_environment
from conspo.tasks.base import Example

MAX_TURNS = 10
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
RESPONSE_TEMPLATE = "<tool_response>\n{content}\n</tool_response>"
NOT_TOOLS = ("reset", "get_reward")


class TrlParams(EnvironmentParams):
    entry_point: str = Field(
        description="The environment_factory class as 'module:Class', in an installed plugin's"
        " package (e.g. 'my_envs.games:GuessEnv')."
    )

    @field_validator("entry_point")
    @classmethod
    def _a_plugins_class(cls, value: str) -> str:
        return check_target(value)


@register_environment(
    "trl",
    params=TrlParams,
    description="A TRL environment_factory class of yours: reset(), its public methods as"
    " tools called with <tool_call> JSON, get_reward() as the final reward.",
    needs=EnvNeeds(max_turns=MAX_TURNS),
)
class TrlEnvironment:
    def __init__(self, params: TrlParams, example: Example, seed: int) -> None:
        self.adapter = TrlAdapter(load_class(params.entry_point)(), example)

    def reset(self) -> str:
        return self.adapter.reset()

    def step(self, action_text: str) -> StepResult:
        return self.adapter.step(action_text)

    def final_reward(self) -> float | None:
        return self.adapter.final_reward()

    def close(self) -> None:
        self.adapter.close()


class TrlAdapter:
    """The protocol over one instance of a TRL environment class (module docstring); a library
    caller may wrap an instance of its own with it, without a registration."""

    def __init__(self, env: Any, example: Example) -> None:
        if not callable(getattr(env, "reset", None)):
            raise TypeError(f"{type(env).__name__} has no reset(): not a TRL environment class")
        self.env = env
        self.example = example
        self.tools = tool_methods(env)

    def reset(self) -> Any:
        row = {"prompt": self.example.prompt, "answer": self.example.answer, **self.example.data}
        observation = _finished(self.env.reset(**_accepted(self.env.reset, row)))
        return "" if observation is None else observation

    def tool_schemas(self) -> list[dict[str, Any]]:
        """Each tool's JSON schema, as TRL renders them into the prompt (transformers'
        ``get_json_schema``: a tool without a docstring for each argument is refused there)."""
        from transformers.utils.chat_template_utils import get_json_schema  # heavy: on use

        return [get_json_schema(method) for method in self.tools.values()]

    def step(self, action_text: str) -> StepResult:
        blocks = TOOL_CALL.findall(action_text)
        if not blocks:
            return StepResult("", done=True, info={"tool_calls": 0})
        results = [self._call(block) for block in blocks]
        observation = "\n".join(RESPONSE_TEMPLATE.format(content=r["content"]) for r in results)
        failures = sum(1 for r in results if r.pop("failed"))
        info = {"tool_calls": len(results), "tool_failures": failures, "tool_results": results}
        return StepResult(observation, info=info)

    def final_reward(self) -> Any:
        get_reward = getattr(self.env, "get_reward", None)
        return _finished(get_reward()) if callable(get_reward) else None

    def close(self) -> None:
        pass  # TRL never closes an environment (a public close() would be one of its tools)

    def _call(self, block: str) -> dict[str, Any]:
        try:
            name, arguments = parse_call(block)
        except ValueError as exc:
            return {"name": None, "content": str({"error": str(exc)}), "failed": True}
        try:
            if name not in self.tools:
                raise ValueError(f"Tool {name} not found.")
            result = _finished(self.tools[name](**arguments))
        except Exception as exc:  # the tool's error is the model's to read, as in TRL
            return {"name": name, "content": str({"error": str(exc)}), "failed": True}
        content = result if isinstance(result, str) else str(result)
        return {"name": name, "content": content, "failed": False}


def tool_methods(env: Any) -> dict[str, Any]:
    """The instance's tools as TRL finds them: the class's public functions (listed on the
    class, since listing the instance would evaluate its properties), bound to ``env``."""
    return {
        name: getattr(env, name)
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if not name.startswith("_") and name not in NOT_TOOLS
    }


def parse_call(block: str) -> tuple[str, dict[str, Any]]:
    """(tool name, arguments) of one ``<tool_call>`` block's JSON; ValueError saying what is
    wrong with it. ``arguments`` may be an object or a string holding one."""
    try:
        call = json.loads(block)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the tool call is not JSON: {exc}") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError('a tool call is {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the tool call's arguments are not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ValueError("a tool call's arguments are a JSON object")
    return call["name"], arguments


def _accepted(fn: Any, row: dict[str, Any]) -> dict[str, Any]:
    """The items of ``row`` that ``fn`` takes: all of them if it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return row
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return row
    return {key: value for key, value in row.items() if key in parameters}


def _finished(value: Any) -> Any:
    """An async method's result awaited (on a loop of this call's own thread)."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value
