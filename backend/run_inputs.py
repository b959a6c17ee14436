"""What a run's config may make a worker read, load or allocate, as the operator's settings say.

A config names dataset files (``task.params.path``, ``eval.benchmarks[i].path``), a model
(``model.name``) and sizes that set how much memory a step takes. The settings bound each
(``CONSPO_DATA_ROOTS``, ``CONSPO_MAX_DATASET_BYTES``, ``CONSPO_MODEL_ROOTS``,
``CONSPO_HUB_ALLOW``, ``CONSPO_MAX_RUN_MEMORY_GIB``). The API refuses a config outside them at
submit time, a 422 at the field, and the worker checks again with its own settings, which are the
ones that count (it passes them to ``conspo.train``). The rules themselves are conspo's
(``conspo.access``, ``conspo.resources``); this module turns settings into them. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.exceptions import RequestValidationError

from backend.config import Settings
from conspo.access import DataFiles, ModelSource, ModelSources, Unavailable
from conspo.config import RunConfig
from conspo.registry import get_task
from conspo.resources import (
    MemoryRefused,
    check_memory,
    dtype_bytes,
    estimate_memory,
    host_memory_bytes,
    source_dims,
)

Loc = tuple[str | int, ...]


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


def refuse_unavailable(config: RunConfig, settings: Settings, loc: Loc) -> None:
    """Raise a 422 (``RequestValidationError``) for each thing ``config`` may not make a worker
    read or allocate, located under ``loc`` (where the request holds the config)."""
    errors = [
        {"type": "value_error", "loc": (*loc, *where), "msg": message, "input": value}
        for where, message, value in problems(config, settings)
    ]
    if errors:
        raise RequestValidationError(errors)


def problems(config: RunConfig, settings: Settings) -> list[tuple[Loc, str, Any]]:
    """(location in the config, message, offending value) of each refusal."""
    files = data_files(settings)
    found = [*_dataset_problems(config, files), *_benchmark_problems(config, files)]
    try:
        source = model_sources(settings).locate(config.model.name)
    except Unavailable as exc:
        return [*found, (("model", "name"), str(exc), config.model.name)]
    refused = _memory_problem(config, source, settings)
    return found + ([refused] if refused else [])


def _dataset_problems(config: RunConfig, files: DataFiles) -> Iterator[tuple[Loc, str, Any]]:
    params, model = config.task.params, get_task(config.task.name).params
    check = files.check_path if getattr(model, "dataset_dirs", False) else files.check
    for field in getattr(model, "data_paths", ()):
        name = params.get(field)
        if name is None:
            continue
        try:
            check(name)
        except (Unavailable, ValueError) as exc:
            yield ("task", "params", field), str(exc), name


def _benchmark_problems(config: RunConfig, files: DataFiles) -> Iterator[tuple[Loc, str, Any]]:
    for i, benchmark in enumerate(config.eval.benchmarks):
        try:
            files.check_path(benchmark.path)
        except (Unavailable, ValueError) as exc:
            yield ("eval", "benchmarks", i, "path"), str(exc), benchmark.path


def _memory_problem(
    config: RunConfig, source: ModelSource, settings: Settings
) -> tuple[Loc, str, Any] | None:
    """The refusal of a config estimated over the limit; None when it fits or when the model's
    dimensions are not readable here (a hub model outside this machine's cache: the worker
    checks it before loading)."""
    dims = source_dims(source)
    if dims is None:
        return None
    model = config.model
    estimate = estimate_memory(config, dims, dtype_bytes(model.dtype, model.device))
    try:
        check_memory(estimate, memory_limit(settings) or host_memory_bytes())
    except MemoryRefused as exc:
        value: Any = config.model_dump(mode="json")
        for key in exc.loc:
            value = value[key]
        return exc.loc, str(exc), value
    return None
