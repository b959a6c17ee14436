"""The one typed configuration of a training run.

The CLI (YAML/JSON files), the REST API, the web form and the worker all validate against
``RunConfig``; its field descriptions are the help text everywhere (form, OpenAPI, README).
The algorithm's own hyperparameters live in ``params`` and are validated against the parameter
model the algorithm registered (``conspo.registry``), so adding an algorithm touches no schema.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from conspo.registry import get_objective, objective_names


def field_error(
    loc: tuple[str | int, ...], message: str, value: Any, title: str = "RunConfig"
) -> ValidationError:
    """A ValidationError located at ``loc`` (so API 422s and CLI messages name the field)."""
    detail: InitErrorDetails = {
        "type": PydanticCustomError("value_error", message),
        "loc": loc,
        "input": value,
    }
    return ValidationError.from_exception_data(title, [detail])


def _relocated(exc: ValidationError, prefix: tuple[str | int, ...]) -> list[InitErrorDetails]:
    """``exc``'s errors as init details with ``prefix`` prepended to each location."""
    return [
        {
            "type": PydanticCustomError(err["type"], err["msg"]),
            "loc": (*prefix, *err["loc"]),
            "input": err.get("input"),
        }
        for err in exc.errors()
    ]


def _resolve_params(
    algorithm: Any, params: Any
) -> tuple[dict[str, Any] | None, list[InitErrorDetails]]:
    """(resolved params, errors located under ``algorithm`` / ``params.<field>``)."""
    if not isinstance(algorithm, str) or not (params is None or isinstance(params, dict)):
        return None, []  # the field validation of RunConfig already reports the wrong type
    try:
        registered = get_objective(algorithm)
    except KeyError:
        valid = ", ".join(objective_names())
        msg = f"unknown algorithm {algorithm!r}; valid algorithms: {valid}"
        return None, _relocated(field_error(("algorithm",), msg, algorithm), ())
    try:
        return registered.params.model_validate(params or {}).model_dump(), []
    except ValidationError as exc:
        return None, _relocated(exc, ("params",))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskConfig(_Section):
    name: Literal["arith", "countdown", "jsonl"] = Field(
        "arith",
        description="arith: procedural arithmetic; countdown: reach a target from given numbers;"
        " jsonl: your own file of {prompt, answer} lines verified as math answers.",
    )
    digits: int = Field(1, ge=1, le=6, description="arith/countdown: digits per operand.")
    operators: str = Field("+-", min_length=1, description="arith: operators to draw from (+-*).")
    num_operands: int = Field(2, ge=2, le=5, description="arith/countdown: operands per problem.")
    path: str | None = Field(None, description="jsonl: path of the training file.")
    eval_path: str | None = Field(
        None,
        description="jsonl: path of the held-out file (default: a split of `path`).",
    )
    eval_size: int = Field(64, ge=1, le=10_000, description="Held-out prompts per evaluation.")

    @model_validator(mode="after")
    def _check(self) -> TaskConfig:
        if self.name == "jsonl" and not self.path:
            raise field_error(
                ("path",),
                "task 'jsonl' needs a path to a file of {prompt, answer} lines",
                None,
                "TaskConfig",
            )
        bad = set(self.operators) - set("+-*")
        if bad:
            raise field_error(
                ("operators",),
                f"unsupported operator(s) {''.join(sorted(bad))!r}; use + - *",
                self.operators,
                "TaskConfig",
            )
        return self


class ModelConfig(_Section):
    name: str = Field(
        "tiny-arith",
        description="A model-store name (tiny, tiny-arith, tiny-countdown: built locally and"
        " SFT-warm-started once), a local directory in Hugging Face format, or a hub id"
        " (loaded with from_pretrained; offline machines need it cached).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on CUDA, float32 on CPU."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when present.")


class SamplingConfig(_Section):
    prompts_per_step: int = Field(16, ge=1, le=4096, description="Prompts (groups) per step.")
    group_size: int = Field(8, ge=2, le=256, description="G: rollouts sampled per prompt.")
    max_new_tokens: int = Field(16, ge=1, le=32_768, description="Response length cap.")
    temperature: float = Field(1.0, gt=0, le=5, description="Rollout sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold.")


class OptimConfig(_Section):
    lr: float = Field(
        3e-5,
        gt=0,
        le=1,
        description="AdamW learning rate (tiny models: 3e-5; the paper: 2e-6 at 1.5B+).",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    mini_batches: int = Field(
        1,
        ge=1,
        le=256,
        description="Optimiser mini-batches per rollout batch; each holds whole groups."
        " With 1, old log-probs are the current ones detached (no extra forward pass).",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warmup steps.")


class EvalConfig(_Section):
    every: int = Field(
        10, ge=0, description="Evaluate every N steps (0: never; always at the end)."
    )
    pass_k: int = Field(4, ge=1, le=64, description="k of pass@k on the held-out split.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature for pass@k.")


class CheckpointConfig(_Section):
    every: int = Field(10, ge=0, description="Checkpoint every N steps (0: only at the end).")
    keep: int = Field(2, ge=1, description="Checkpoints kept on disk.")


class LoggingConfig(_Section):
    rollout_sample: int = Field(
        64,
        ge=0,
        le=4096,
        description="Per-rollout (score, reward) records kept per step.",
    )


class RunConfig(_Section):
    name: str | None = Field(None, max_length=200, description="Display name of the run.")
    algorithm: str = Field(
        "conspo",
        description="Objective: conspo, grpo, dapo or dr_grpo (see /api/presets).",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The algorithm's hyperparameters; unspecified ones take its defaults.",
    )
    steps: int = Field(50, ge=1, le=1_000_000, description="Training steps (rollout batches).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for data, sampling and init.")
    task: TaskConfig = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="wrap")
    @classmethod
    def _validate_with_params(
        cls, data: Any, handler: ModelWrapValidatorHandler[RunConfig]
    ) -> RunConfig:
        """Validate the sections and the algorithm's ``params`` in one pass.

        ``params`` is checked against the parameter model the algorithm registered and replaced
        by the full, resolved set. Both are validated even when the other fails, so one error
        response lists every bad field (a form shows them all at once, not in two rounds).
        """
        details: list[InitErrorDetails] = []
        config: RunConfig | None = None
        try:
            config = handler(data)
        except ValidationError as exc:
            details.extend(_relocated(exc, ()))
        if not isinstance(data, dict):  # an instance (already resolved) or a bad type
            if details:
                raise ValidationError.from_exception_data(cls.__name__, details)
            assert config is not None
            return config
        resolved, param_details = _resolve_params(
            data.get("algorithm", "conspo"), data.get("params")
        )
        details.extend(param_details)
        if details:
            raise ValidationError.from_exception_data(cls.__name__, details)
        assert config is not None and resolved is not None
        config.params = resolved
        return config

    def objective_params(self) -> BaseModel:
        return get_objective(self.algorithm).params.model_validate(self.params)

    @classmethod
    def from_file(cls, path: str | Path) -> RunConfig:
        """Load YAML (.yaml/.yml) or JSON."""
        path = Path(path)
        text = path.read_text()
        if path.suffix in {".yaml", ".yml"}:
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        return cls.model_validate(data)
