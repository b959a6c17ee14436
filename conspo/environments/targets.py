"""Naming a user's class in a config (``"my_envs.games:GuessEnv"``), safely.

A config comes from whoever may submit a run, and importing a module or building a class it
names runs that code on a worker: ``subprocess:Popen`` with the right keyword arguments would
run any command. So an adapter (``gym``, ``trl``) takes only a class in the package of a
plugin the operator installed (``conspo.plugins``: an entry point or ``CONSPO_PLUGINS``), whose
code runs in every process already; anything else is refused at the field.
"""

from __future__ import annotations

import importlib
import re

from conspo import plugins

TARGET = re.compile(r"^(?P<module>[A-Za-z_]\w*(\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*)$")


def allowed_roots() -> set[str]:
    """The top-level modules of the plugins this process loaded (a ``.py`` plugin file is the
    module ``conspo.plugins`` imported it as)."""
    roots = set()
    for plugin in plugins.plugins():
        if not plugin.loaded:
            continue
        module = plugin.target.split(":")[0]
        if module.endswith(".py") or "/" in module or "\\" in module:
            module = plugins.file_module_name(module)
        roots.add(module.split(".")[0])
    return roots


def check_target(target: str) -> str:
    """``target`` when it names a class a config may use ("module:Class" in a plugin's
    package); else a ValueError saying why (a config's field validator)."""
    match = TARGET.match(target)
    if match is None:
        raise ValueError(f"{target!r} is not 'module:Class' (e.g. 'my_envs.games:GuessEnv')")
    root = match["module"].split(".")[0]
    roots = allowed_roots()
    if root not in roots:
        loaded = ", ".join(sorted(roots)) or "none"
        raise ValueError(
            f"{match['module']!r} is not in a loaded plugin's package (loaded: {loaded});"
            " install it as a plugin (the conspo.plugins entry point or CONSPO_PLUGINS)"
        )
    return target


def load_class(target: str) -> type:
    """The class ``target`` names (checked by ``check_target`` first)."""
    check_target(target)
    module_name, attr = target.split(":")
    value = getattr(importlib.import_module(module_name), attr)
    if not isinstance(value, type):
        raise TypeError(f"{target} is a {type(value).__name__}, not a class")
    return value
