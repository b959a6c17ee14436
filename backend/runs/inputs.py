"""What a run's config may make a worker read, load or allocate, as the operator's settings say.

A config names dataset files (``task.params.path``, ``kind_params.path``,
``eval.benchmarks[i].path``), models (``model.name``, ``kind_params.teacher``) and sizes that
set how much memory a step takes. The settings bound each (``CONSPO_DATA_ROOTS``,
``CONSPO_MAX_DATASET_BYTES``, ``CONSPO_MODEL_ROOTS``, ``CONSPO_HUB_ALLOW``,
``CONSPO_MAX_RUN_MEMORY_GIB``). The API refuses a config outside them at submit time
(``backend.runs.submit``: a 422 at the field), and the worker checks again with its own
settings, which are the ones that count (it passes them to ``conspo.train``). The rules
themselves are conspo's (``conspo.access``, ``conspo.models.resources``); this module turns
settings into them. Torch-free.

A config that makes a worker run model-written code (``RunConfig.code_execution``: a tool such
as ``python``, a task whose verifier runs the answer) needs a worker with a sandbox: it is
refused while no live worker advertises ``sandbox: "bwrap"`` (``worker.capabilities``), and a
tool call may not run longer than ``CONSPO_SANDBOX_MAX_TIMEOUT_S``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter, ValidationError
from sqlalchemy.orm import Session

from backend import liveness
from backend.config import Settings
from backend.models import utcnow
from conspo.access import DataFiles, ModelSource, ModelSources, Unavailable
from conspo.config import RunConfig
from conspo.generation.vllm_interpreter import vllm_available
from conspo.input_checks import Label
from conspo.models.resources import (
    MemoryEstimate,
    MemoryRefused,
    check_budget,
    check_memory,
    dtype_bytes,
    estimate_memory,
    source_dims,
)
from conspo.registry import get_job_kind, get_task
from conspo.rewards.base import field_name, model_fields
from conspo.system import host_memory_bytes
from conspo.tasks.datasets import layout_problem

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str, Any]  # (location in the config, message, offending value)


def data_files(settings: Settings) -> DataFiles:
    return DataFiles(roots=tuple(settings.data_roots), max_bytes=settings.max_dataset_bytes)


def model_sources(settings: Settings) -> ModelSources:
    """The model store, the model roots and the hub allowlist (never unbounded here)."""
    assert settings.model_store is not None  # Settings fills it in
    roots = (settings.model_store, *settings.model_roots)
    return ModelSources(roots=roots, hub_allow=tuple(settings.hub_allow))


def memory_limit(settings: Settings) -> int:
    """Bytes a run may use; 0 leaves it to the machine (a worker: its device's memory)."""
    return int(settings.max_run_memory_gib * 2**30)


@dataclass(frozen=True)
class Requirement:
    """An optional package that a config value needs."""

    loc: Loc
    value: str
    module: str  # the package's name, for the message
    alternative: str  # what to use instead
    here: Callable[[], bool]  # whether this process has it
    # Whether a worker row's capabilities (``worker.capabilities.probe``) include it.
    advertised_by: Callable[[dict[str, Any]], bool]


def requirements(config: RunConfig) -> list[Requirement]:
    found = []
    if config.sampling.engine == "vllm":
        found.append(
            Requirement(
                ("sampling", "engine"),
                "vllm",
                "vllm",
                "native or hf",
                vllm_available,  # vLLM's own interpreter (`make vllm`), not an import here
                lambda caps: "vllm" in (caps.get("engines") or []),
            )
        )
    if config.model.attn_implementation == "flash_attention_2":
        found.append(
            Requirement(
                ("model", "attn_implementation"),
                "flash_attention_2",
                "flash_attn",
                "sdpa",
                lambda: importlib.util.find_spec("flash_attn") is not None,
                lambda caps: bool(caps.get("flash_attn")),
            )
        )
    return found


def live_capabilities(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """What each live worker advertised at start (``worker.capabilities.probe``)."""
    seen_after = utcnow() - timedelta(seconds=settings.worker_alive_s)
    return [w.capabilities or {} for w in liveness.alive(session, seen_after)]


def auto_device(session: Session, settings: Settings) -> str:
    """Where ``model.device: auto`` will run, as the memory estimate counts a weight's bytes:
    "cpu" when workers are alive and none has a GPU (the embedded default, a CPU cluster:
    float32, 4 bytes), else "auto" (a GPU worker, or none known yet: bfloat16's 2). Issue 49's
    walk: the form said 2-byte weights for an SFT stage its CPU worker ran in float32."""
    workers = live_capabilities(session, settings)
    return "cpu" if workers and not any(w.get("cuda") for w in workers) else "auto"


def missing_software(config: RunConfig, session: Session, settings: Settings) -> list[Problem]:
    """Each field whose value needs a package that neither this process can import nor any
    live worker advertises (a GPU worker may have vLLM where the API does not)."""
    needed = [r for r in requirements(config) if not r.here()]
    if not needed:
        return []
    workers = live_capabilities(session, settings)
    return [
        (
            r.loc,
            f"{r.value} needs the {r.module} package, which is not installed here nor on"
            f" any live worker ({len(workers)} alive; /api/health lists what each has): install"
            f" it where runs run, or use {r.alternative}",
            r.value,
        )
        for r in needed
        if not any(r.advertised_by(caps) for caps in workers)
    ]


def missing_plugins(config: RunConfig, session: Session, settings: Settings) -> list[Problem]:
    """Each field naming an entry that a plugin registered (``conspo.plugins``) while no live
    worker loaded that plugin: the run would fail there as an unknown name. The API's own
    process does not count (it validates configs; workers run them)."""
    needed = [
        (loc, registry.kind, name, plugin)
        for loc, registry, name in config.registered_at()
        if (plugin := registry.origin(name)) is not None
    ]
    if not needed:
        return []
    workers = live_capabilities(session, settings)

    def loaded_by(caps: dict[str, Any]) -> set[str]:
        report = caps.get("plugins") or {}
        return {str(p.get("name")) for p in report.get("loaded", []) if isinstance(p, dict)}

    loaded = set().union(*(loaded_by(caps) for caps in workers)) if workers else set()
    return [
        (
            loc,
            f"{kind} {name!r} comes from the plugin {plugin!r}, which no live worker has"
            f" loaded ({len(workers)} alive; /api/health lists each worker's plugins): install"
            " it where runs run (pip install, or CONSPO_PLUGINS) and restart the worker",
            name,
        )
        for loc, kind, name, plugin in needed
        if plugin not in loaded
    ]


def code_execution_fields(config: RunConfig) -> list[tuple[Loc, str, Any]]:
    """Where ``config`` makes a worker run model-written code: (location, what in words, value)
    for each part ``RunConfig.code_execution_at`` names."""
    return [(loc, what, _value_at(config, loc)) for loc, what in config.code_execution_at()]


def _value_at(config: RunConfig, loc: Loc) -> Any:
    """The config's value at ``loc`` (attributes and list indices), for an error's input."""
    value: Any = config
    for part in loc:
        if isinstance(value, dict):  # a section's free-form params (task.params.environment)
            value = value.get(part)
        else:
            value = value[part] if isinstance(part, int) else getattr(value, part)
    return value


def missing_sandbox(config: RunConfig, session: Session, settings: Settings) -> list[Problem]:
    """Each field that makes a worker run model-written code, while no live worker can sandbox
    it. The API's own machine does not count: the API never runs such code, and a worker
    without a sandbox refuses it (``conspo.sandbox.require_sandbox``; a platform worker never
    runs it unsandboxed). As with a package no worker has, no live worker at all means no
    sandbox."""
    fields = code_execution_fields(config)
    if not fields:
        return []
    workers = live_capabilities(session, settings)
    if any(caps.get("sandbox") == "bwrap" for caps in workers):
        return []
    where = f"sandbox: none on each of the {len(workers)} alive" if workers else "0 alive"
    return [
        (
            loc,
            f"{what} runs model-written code; no live worker has a sandbox ({where};"
            " /api/health lists what each has): install bubblewrap (bwrap) where runs run"
            " and restart the worker, or leave it out",
            value,
        )
        for loc, what, value in fields
    ]


def tool_limit_problems(config: RunConfig, settings: Settings, *, here: str) -> list[Problem]:
    """A tool call allowed longer than ``sandbox_max_timeout_s`` (``here``: "this platform",
    "this worker": whose limit it is)."""
    cap = settings.sandbox_max_timeout_s
    if not config.tools.sandboxed() or config.tools.timeout_s <= cap:
        return []
    message = (
        f"a tool call may run at most {cap:g} s on {here} (CONSPO_SANDBOX_MAX_TIMEOUT_S);"
        f" tools.timeout_s is {config.tools.timeout_s:g}"
    )
    return [(("tools", "timeout_s"), message, config.tools.timeout_s)]


class Refused(ValueError):
    """A config the worker's own settings refuse (its first line is the run's error)."""


def refuse_on_worker(config: RunConfig, settings: Settings) -> None:
    """The worker's check, with its own settings, of what the API checked at submit with its
    own (the rest is conspo's, inside ``train``: files, models, memory, the sandbox)."""
    found = tool_limit_problems(config, settings, here="this worker")
    if found:
        raise Refused("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg, _ in found))


def problems(config: RunConfig, settings: Settings, auto: str = "auto") -> list[Problem]:
    """(location in the config, message, offending value) of each refusal. ``auto``: where
    ``model.device: auto`` runs (``auto_device``)."""
    files = data_files(settings)
    sources = model_sources(settings)
    found = [
        *tool_limit_problems(config, settings, here="this platform"),
        *_dataset_problems(config, files),
        *_benchmark_problems(config, files),
        *_kind_model_problems(config, sources),
        *_simulator_problems(config, sources),
        *_reward_model_problems(config, sources),
        *_objective_model_problems(config, sources),
    ]
    try:
        source = sources.locate(config.model.name)
    except Unavailable as exc:
        return [*found, (("model", "name"), str(exc), config.model.name)]
    refused = _memory_problem(config, source, settings, auto)
    return found + ([refused] if refused else [])


def unlocated_model(raw: Any, settings: Settings) -> Problem | None:
    """The problem with the model a config that failed validation names, found as a valid
    config's would be: a person fixing a form learns of a bad ``model.name`` with the other
    errors, not after fixing them. None when the name is fine, absent, or not a name at all
    (the validation's own error says so)."""
    model = raw.get("model") if isinstance(raw, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    if not isinstance(name, str):
        return None
    try:
        _LABEL.validate_python(name)
        model_sources(settings).locate(name)
    except ValidationError:
        return None
    except Unavailable as exc:
        return ("model", "name"), str(exc), name
    return None


_LABEL = TypeAdapter(Label)


def _kind_model_problems(config: RunConfig, sources: ModelSources) -> Iterator[Problem]:
    """The models a job kind's params name (the params model's ``model_names``: distillation's
    teacher) that the model sources refuse, as ``model.name`` would be."""
    fields = getattr(get_job_kind(config.kind).params, "model_names", ())
    named = {field: config.kind_params.get(field) for field in fields}
    yield from _named_model_problems("kind_params", named, sources)


def _objective_model_problems(config: RunConfig, sources: ModelSources) -> Iterator[Problem]:
    """The models the objective's params name (the params model's ``model_names``: PPO's
    critic_model) that the model sources refuse, as ``model.name`` would be."""
    params = config.objective_params()
    fields = getattr(type(params), "model_names", ())
    yield from _named_model_problems(
        "params", {field: getattr(params, field, None) for field in fields}, sources
    )


def _named_model_problems(
    section: str, named: dict[str, str | None], sources: ModelSources
) -> Iterator[Problem]:
    """Each model of ``named`` (field → name, None: not set) the model sources refuse,
    located at ``<section>.<field>`` with model.name's message."""
    for field, name in named.items():
        if name is None:
            continue
        try:
            sources.locate(name)
        except Unavailable as exc:
            message = str(exc).replace("model.name", f"{section}.{field}", 1)
            yield (section, field), message, name


def _simulator_problems(config: RunConfig, sources: ModelSources) -> Iterator[Problem]:
    """The environment's simulator model, when the model sources refuse it (as model.name)."""
    name = config.environment.simulator
    if name is None:
        return
    try:
        sources.locate(name)
    except Unavailable as exc:
        message = str(exc).replace("model.name", "environment.simulator", 1)
        yield ("environment", "simulator"), message, name


def _reward_model_problems(config: RunConfig, sources: ModelSources) -> Iterator[Problem]:
    """The models the run's rewards name (``rewards[i].params.model``: reward_model's) that
    the model sources refuse, as ``model.name`` would be."""
    for loc, name in model_fields(config):
        try:
            sources.locate(name)
        except Unavailable as exc:
            yield loc, str(exc).replace("model.name", field_name(loc), 1), name


def _dataset_problems(config: RunConfig, files: DataFiles) -> Iterator[Problem]:
    """The dataset files a task's params or a job kind's params name (the params model's
    ``data_paths``; ``dataset_dirs``: a directory may do, if it holds a dataset) that the data
    roots refuse."""
    for loc, params, model in (
        (("task", "params"), config.task.params, get_task(config.task.name).params),
        (("kind_params",), config.kind_params, get_job_kind(config.kind).params),
    ):
        dirs = getattr(model, "dataset_dirs", False)  # read by conspo.datasets: a layout
        for field in getattr(model, "data_paths", ()):
            name = params.get(field)
            if name is None:
                continue
            try:
                real = files.check_path(name) if dirs else files.check(name)
            except (Unavailable, ValueError) as exc:
                yield (*loc, field), str(exc), name
                continue
            if dirs and (problem := layout_problem(name, real)):
                yield (*loc, field), problem, name


def memory_report(
    config: RunConfig, settings: Settings, question_chars: int | None = None, auto: str = "auto"
) -> dict[str, Any]:
    """What the form shows beside its submit button: ``conspo.models.resources``' estimate of
    ``config``, the limit a run may use here, whether it fits (what submitting would check),
    and a line of text. The numbers are None when the model's dimensions are not readable here.
    ``question_chars``: the longest question the task's check drew (an sft step's rows);
    ``auto``: where ``model.device: auto`` runs (``auto_device``)."""
    limit = report_limit(settings)
    unknown = {
        "total_bytes": None,
        "parts": None,
        "limit_bytes": limit,
        "micro_batch_tokens": None,
        "fits": None,
    }
    try:
        source = model_sources(settings).locate(config.model.name)
    except Unavailable as exc:
        return {**unknown, "text": str(exc)}
    dims = source_dims(source)
    if dims is None:
        return {**unknown, "text": f"{config.model.name}: dimensions not readable here"}
    estimate = _estimate(config, dims, limit, question_chars, auto)
    try:
        check_budget(estimate, config)
        check_memory(estimate, limit)
        fits, text = True, f"needs {estimate.describe()} of the {limit / 2**30:,.1f} GiB allowed"
    except MemoryRefused as exc:
        fits, text = False, str(exc)
    parts = {
        "process": estimate.process,
        "state": estimate.state,
        "sampling": estimate.sampling,
        "evaluation": estimate.evaluation,
        "update": estimate.update,
    }
    report = {
        "total_bytes": estimate.total,
        "parts": parts,
        "limit_bytes": limit,
        "micro_batch_tokens": estimate.micro_batch_tokens,
    }
    if warning := _slow_dtype(config):
        text = f"{text}; {warning}: pick float32 here"
    return {**report, "fits": fits, "text": text}


def _slow_dtype(config: RunConfig) -> str | None:
    """The warning when ``config`` would compute in bfloat16 on this machine's CPU, which has no
    native bfloat16 (a worker on the same kind of CPU: the embedded default, a CPU cluster)."""
    import torch

    from conspo.models.precision import emulated_bfloat16

    cpu = config.model.device == "cpu" or (
        config.model.device == "auto" and not torch.cuda.is_available()
    )
    return emulated_bfloat16("cpu", config.model.dtype) if cpu else None


def report_limit(settings: Settings) -> int:
    """The limit submitting checks a config against: the setting, or this machine's memory."""
    return memory_limit(settings) or host_memory_bytes()


def estimated_bytes(config: RunConfig, settings: Settings) -> int | None:
    """``conspo.resources``' estimate of a step's peak bytes; None when the model is not
    available or its dimensions are not readable here."""
    try:
        dims = source_dims(model_sources(settings).locate(config.model.name))
    except Unavailable:
        return None
    return None if dims is None else _estimate(config, dims, report_limit(settings)).total


def _estimate(
    config: RunConfig,
    dims: Any,
    limit: int,
    question_chars: int | None = None,
    auto: str = "auto",
) -> MemoryEstimate:
    device = auto if config.model.device == "auto" else config.model.device
    dtype = dtype_bytes(config.model.dtype, device)
    return estimate_memory(config, dims, dtype, limit, question_chars=question_chars)


def _benchmark_problems(config: RunConfig, files: DataFiles) -> Iterator[Problem]:
    for i, benchmark in enumerate(config.eval.benchmarks):
        if benchmark.path is None:  # a built-in benchmark (source: humaneval) reads no file
            continue
        try:
            files.check_path(benchmark.path)
        except (Unavailable, ValueError) as exc:
            yield ("eval", "benchmarks", i, "path"), str(exc), benchmark.path


def _memory_problem(
    config: RunConfig, source: ModelSource, settings: Settings, auto: str = "auto"
) -> Problem | None:
    """The refusal of a config estimated over the limit; None when it fits or when the model's
    dimensions are not readable here (a hub model outside this machine's cache: the worker
    checks it before loading)."""
    dims = source_dims(source)
    if dims is None:
        return None
    limit = report_limit(settings)
    estimate = _estimate(config, dims, limit, auto=auto)
    try:
        check_budget(estimate, config)
        check_memory(estimate, limit)
    except MemoryRefused as exc:
        value: Any = config.model_dump(mode="json")
        for key in exc.loc:
            value = value[key]
        return exc.loc, str(exc), value
    return None
