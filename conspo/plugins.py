"""Users' own code as plugins: tasks, rewards, tools, objectives and job kinds from modules
outside this package, registered exactly like the built-in ones.

Two ways in, read once per process before the first registry lookup (``conspo.registry``):

- the ``conspo.plugins`` entry-point group, the Python convention: a package that declares

      [project.entry-points."conspo.plugins"]
      my_envs = "my_envs"            # a module whose import registers (or "my_envs:setup", called)

  is found by ``pip install my-envs`` alone;
- ``CONSPO_PLUGINS``: module names or ``.py`` files, separated by commas or spaces
  (``CONSPO_PLUGINS="my_rewards, ./lab/guess_env.py"``), for code that is not a package.

Every process that resolves a config reads them (the API, each worker, the CLI, the library),
and each says what it loaded: ``/api/health`` for the API and in each worker's capabilities, so
the API can refuse a run whose plugin no live worker has. A plugin that fails to import is
reported by name (``failed()``, a log line at start) and what it had registered is taken back,
so a half-imported plugin leaves no half of itself in the registries. Torch-free.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ENTRY_POINT_GROUP = "conspo.plugins"
ENV_VAR = "CONSPO_PLUGINS"
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

log = logging.getLogger(__name__)


@dataclass
class Plugin:
    """One plugin as this process loaded it (or failed to)."""

    name: str  # the entry point's name, or the CONSPO_PLUGINS item as written
    target: str  # what was imported: "module", "module:attr" or a file's absolute path
    source: str  # "entry point" or CONSPO_PLUGINS
    distribution: str | None = None  # the installed package that declared the entry point
    version: str | None = None
    # kind ("task", "reward", ...) -> the names it registered there
    provides: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None  # why it failed to load; None when it loaded

    @property
    def loaded(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        """JSON for /api/health and a worker's capabilities."""
        return {
            "name": self.name,
            "target": self.target,
            "source": self.source,
            "distribution": self.distribution,
            "version": self.version,
            "provides": {kind: sorted(names) for kind, names in sorted(self.provides.items())},
            "error": self.error,
        }


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.started = False  # loading began (re-entrant lookups during it return at once)
        self.plugins: list[Plugin] = []
        self.current: Plugin | None = None  # the plugin whose import is running
        # what the current plugin registered: (registry, name), taken back if it fails
        self.added: list[tuple[Any, str]] = []
        self.origin: dict[tuple[str, str], str] = {}  # (kind, name) -> plugin name
        self.modules: set[str] = set()  # modules the plugins' imports added to sys.modules


_state = _State()
# Every registry, as conspo.registry lists them (it hands this module the function when it is
# imported: this module may not import it back).
_registries: Callable[[], list[Any]] = list


def use_registries(registries: Callable[[], list[Any]]) -> None:
    global _registries
    _registries = registries


def load_plugins() -> list[Plugin]:
    """Import every plugin once per process (later calls return what the first found). Each
    registry's built-ins are loaded first, so a plugin that reuses a built-in name fails by
    name instead of shadowing it."""
    with _state.lock:
        if _state.started:
            return list(_state.plugins)
        _state.started = True
        for registry in _registries():
            registry.load_builtins()
        for plugin, load in _declared():
            _load_one(plugin, load)
        for p in _state.plugins:
            if p.error:
                log.error("plugin %r (%s) failed to load: %s", p.name, p.target, p.error)
            else:
                log.info("plugin %r loaded from %s: %s", p.name, p.target, p.provides)
        return list(_state.plugins)


def declared() -> bool:
    """Whether any plugin is declared (cheap: nothing is imported)."""
    return bool(_listed(os.environ.get(ENV_VAR, ""))) or bool(
        importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    )


def plugins() -> list[Plugin]:
    """The plugins this process tried, loading them first if no lookup has yet."""
    return load_plugins()


def failed() -> list[Plugin]:
    return [p for p in load_plugins() if not p.loaded]


def report() -> dict[str, Any]:
    """What this process loaded, as JSON: ``{"loaded": [...], "failed": [...]}``."""
    found = load_plugins()
    return {
        "loaded": [p.as_dict() for p in found if p.loaded],
        "failed": [p.as_dict() for p in found if not p.loaded],
    }


def origin(kind: str, name: str) -> str | None:
    """The plugin that registered ``name`` in the ``kind`` registry; None for a built-in."""
    return _state.origin.get((kind, name))


def note_registered(registry: Any, name: str) -> None:
    """Called by ``Registry.add``: a name registered while a plugin's import runs is that
    plugin's (its origin, and what is taken back if the import then fails)."""
    plugin = _state.current
    if plugin is None:
        return
    _state.added.append((registry, name))
    plugin.provides.setdefault(registry.kind, []).append(name)
    _state.origin[(registry.kind, name)] = plugin.name


def _declared() -> Iterator[tuple[Plugin, Callable[[], object]]]:
    """(plugin, how to import it) for each entry point, then each CONSPO_PLUGINS item."""
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=_ep_key):
        dist = getattr(ep, "dist", None)
        plugin = Plugin(
            ep.name,
            ep.value,
            "entry point",
            distribution=dist.name if dist is not None else None,
            version=dist.version if dist is not None else None,
        )
        yield plugin, ep.load
    for item in _listed(os.environ.get(ENV_VAR, "")):
        if _is_file(item):
            path = Path(item).expanduser().resolve()
            yield Plugin(item, str(path), ENV_VAR), _file_loader(path)
        else:
            yield Plugin(item, item, ENV_VAR), _module_loader(item)


def _ep_key(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    return ep.name, ep.value


def _listed(value: str) -> list[str]:
    """CONSPO_PLUGINS' items in order, each once."""
    items = [item for item in re.split(r"[,\s]+", value) if item]
    return list(dict.fromkeys(items))


def _is_file(item: str) -> bool:
    return item.endswith(".py") or os.sep in item or "/" in item


def _module_loader(name: str) -> Callable[[], object]:
    def load() -> object:
        if not _MODULE_NAME.match(name):
            raise ValueError(
                f"{name!r} is neither a module name (my_pkg.rewards) nor a .py file's path"
            )
        return importlib.import_module(name)

    return load


def file_module_name(path: str | Path) -> str:
    """The module name a ``.py`` plugin file is imported as (in ``sys.modules``)."""
    return "conspo_plugin_" + re.sub(r"\W", "_", Path(path).stem)


def _file_loader(path: Path) -> Callable[[], object]:
    def load() -> object:
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        module_name = file_module_name(path)
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        return module

    return load


def _load_one(plugin: Plugin, load: Callable[[], object]) -> None:
    """Import one plugin; an entry point naming a callable (``pkg:setup``) has it called. On
    any failure the plugin's registrations are taken back and the error kept."""
    _state.plugins.append(plugin)
    before = set(sys.modules)
    with _importing(plugin):
        try:
            loaded = load()
            if callable(loaded) and not isinstance(loaded, ModuleType | type):
                loaded()
            if plugin.version is None and isinstance(loaded, ModuleType):
                plugin.version = getattr(loaded, "__version__", None)
        except Exception as exc:  # noqa: BLE001 - a plugin is user code: reported, never fatal
            plugin.error = _reason(exc)
            for registry, name in _state.added:
                registry.discard(name)
                _state.origin.pop((registry.kind, name), None)
            plugin.provides.clear()
    _state.modules |= set(sys.modules) - before


@contextmanager
def _importing(plugin: Plugin) -> Iterator[None]:
    _state.current, _state.added = plugin, []
    try:
        yield
    finally:
        _state.current, _state.added = None, []


def _reason(exc: BaseException) -> str:
    """The exception and where in the plugin's code it arose (its last frame), in one line."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<")
        and frame.filename != __file__
        and Path(frame.filename).parent.name != "importlib"  # the import machinery's own
    ]
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def reset() -> None:
    """Take every plugin's registrations back and forget what was loaded, so the next lookup
    loads the plugins again (tests change CONSPO_PLUGINS within one process)."""
    global _state
    with _state.lock:
        by_kind = {registry.kind: registry for registry in _registries()}
        for kind, name in _state.origin:
            by_kind[kind].discard(name)
        for module in _state.modules:  # imported again (and registering again) on next load
            sys.modules.pop(module, None)
        _state = _State()
