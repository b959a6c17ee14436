"""The import graph of our own packages has no circle: each room depends on the rooms below it.

A circle means two modules can only be understood (and imported) together. Imports inside
functions count too: they are the usual way a circle is hidden, not broken. ``TYPE_CHECKING``
imports never run, so the graph of all our packages leaves them out; within a package whose
rooms are drawn below (``ROOMS``) they count too: a module that needs another's types to be read
depends on it as much as one that imports it. An import of ``a.b.c`` counts as an edge to that
module (and to a package only when the package itself is named), so a package's ``__init__`` is
not an implicit parent of every module below it.

``ROOMS`` orders a package's rooms from bottom to top: a module may import its own room and the
rooms below, never one above (``upward_arrows``).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("conspo", "backend", "worker", "conspo_lab")

Rooms = tuple[tuple[str, ...], ...]  # from the bottom up; a room is modules and packages

# backend, from the bottom up. The base: settings, errors, the schema, the database, tokens,
# worker liveness rows, where the frontend's files lie. The run domain (lifecycle, rows, submit
# checks, scheduling, queue) and the alerts (rules over run rows, webhook calls) need only the
# base; the API's models need run rows and scheduling
# (a run as the API shows it, why it waits); storage writes are conditional on the lifecycle's
# ownership; studies, pipelines and the model registry are made of runs and stored points; the
# API routes them; the HTML pages and the app are on top.
BACKEND_ROOMS: Rooms = (
    (
        "backend.config",
        "backend.errors",
        "backend.models",
        "backend.db",
        "backend.security",
        "backend.liveness",
        "backend.assets",
        "backend.migrate",
        "backend.markdown",
        "backend.task_checks",
    ),
    ("backend.runs", "backend.alerts"),
    ("backend.schemas",),
    ("backend.storage",),
    ("backend.studies", "backend.pipelines", "backend.model_registry"),
    ("backend.api",),
    ("backend.pages",),
    ("backend.main",),
)
# conspo, from the bottom up. The base: the config and its checks, the registries, the metric
# catalogue, the users' plugins (loaded by the registries), the sink, access to files and
# models, the catalogue of built-in models, the sandbox for model-written code (standard
# library only) and the task and environment interfaces (what the registry's entries are typed
# against). Then what registers there (tasks, objectives, rewards, tools, environments); the
# models (loading, precision, the store, resources); generation and the collectives;
# evaluation; supervised fine-tuning, which the built-ins' warm starts run (``models.builtins``:
# the one module of models/ that trains, handed to the store as its builder); the RL trainer
# and the loop; the job kinds and the TRL integration; the launcher; the command line.
CONSPO_ROOMS: Rooms = (
    (
        "conspo.lazy",
        "conspo.input_checks",
        "conspo.templates",
        "conspo.spreadsheet",
        "conspo.metrics",
        "conspo.plugins",
        "conspo.registry",
        "conspo.sink",
        "conspo.system",
        "conspo.access",
        "conspo.config",
        "conspo.demo",
        "conspo.models.catalog",
        "conspo.tasks.base",
        "conspo.environments.base",
        "conspo.sandbox",
        "conspo.stopping",
    ),
    (
        "conspo.tasks",
        "conspo.objectives",
        "conspo.rewards",
        "conspo.tools",
        "conspo.environments",
        "conspo.credit",
    ),
    ("conspo.models",),
    ("conspo.generation", "conspo.distributed"),
    ("conspo.models.scoring",),  # a judge samples through generation's engine
    ("conspo.evaluation",),
    ("conspo.training.sft",),
    ("conspo.models.builtins",),
    ("conspo.training",),
    ("conspo.jobs", "conspo.integrations"),
    ("conspo.launch",),
    ("conspo.cli", "conspo.__main__"),
)
ROOMS: dict[str, Rooms] = {"backend": BACKEND_ROOMS, "conspo": CONSPO_ROOMS}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def own_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(
    path: Path, name: str, modules: dict[str, Path], *, include_type_only: bool = False
) -> set[str]:
    """The own modules that ``name`` (at ``path``) imports when it runs, and with
    ``include_type_only`` those it imports under ``if TYPE_CHECKING:`` as well."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip: set[int] = set()
    if not include_type_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _type_checking_only(node):
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(include_type_only: bool = False) -> dict[str, set[str]]:
    """Each own module → the own modules it imports (at runtime; with ``include_type_only``,
    under ``TYPE_CHECKING`` too)."""
    modules = own_modules()
    return {
        name: imports_of(path, name, modules, include_type_only=include_type_only)
        for name, path in modules.items()
    }


def inside(name: str, prefix: str) -> bool:
    """``name`` is the module or package ``prefix`` or lies below it."""
    return name == prefix or name.startswith(prefix + ".")


def within(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The part of ``graph`` inside ``package``: its modules and the edges between them."""
    return {
        name: {d for d in deps if inside(d, package)}
        for name, deps in graph.items()
        if inside(name, package)
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, …, a], or None (iterative DFS, colours white/grey/black)."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        path = [start]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            nxt = todo.pop()
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, sorted(graph[nxt])))
    return None


def room_of(name: str, rooms: Rooms) -> int | None:
    """The index of ``name``'s room (the entry naming it or its closest package), else None."""
    best: tuple[int, int] | None = None  # (length of the matching entry, room)
    for level, room in enumerate(rooms):
        for entry in room:
            if inside(name, entry) and (best is None or len(entry) > best[0]):
                best = (len(entry), level)
    return None if best is None else best[1]


def upward_arrows(graph: dict[str, set[str]], rooms: Rooms) -> list[tuple[str, str]]:
    """Every (importer, imported) whose imported module lies in a room above the importer's."""
    arrows = []
    for name in sorted(graph):
        level = room_of(name, rooms)
        if level is None:
            continue
        for dep in sorted(graph[name]):
            above = room_of(dep, rooms)
            if above is not None and above > level:
                arrows.append((name, dep))
    return arrows


def test_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_no_import_circle_counting_type_only_imports(package: str) -> None:
    cycle = find_cycle(within(import_graph(include_type_only=True), package))
    assert cycle is None, "import circle (type-only imports count): " + " -> ".join(cycle or [])


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_every_module_has_a_room(package: str) -> None:
    """A new module is placed in the table, so the next test sees its arrows."""
    homeless = [
        name
        for name in sorted(within(import_graph(), package))
        if name != package and room_of(name, ROOMS[package]) is None
    ]
    assert not homeless, f"no room in ROOMS[{package!r}] for {homeless}"


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_no_arrow_back_up(package: str) -> None:
    """No module imports a room above its own, at runtime or for its types."""
    graph = within(import_graph(include_type_only=True), package)
    arrows = upward_arrows(graph, ROOMS[package])
    assert not arrows, "imports of a room above: " + ", ".join(f"{a} -> {b}" for a, b in arrows)


def test_the_check_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_check_finds_an_arrow_back_up() -> None:
    rooms: Rooms = (("p.base", "p.util"), ("p.domain",), ("p.web",))
    graph = {
        "p.base": set(),
        "p.util": {"p.base"},  # its own room
        "p.domain.a": {"p.base", "p.domain.b"},
        "p.domain.b": {"p.web.pages"},  # up: domain imports web
        "p.web.pages": {"p.domain.a", "p.util"},
        "p.web": set(),
        "p.elsewhere": {"p.web"},  # in no room: not checked here (``test_every_module_has_a_room``)
    }
    assert upward_arrows(graph, rooms) == [("p.domain.b", "p.web.pages")]
    assert room_of("p.domain", rooms) == 1 and room_of("p.domainx", rooms) is None
    assert upward_arrows({"p.web.pages": {"p.base"}}, rooms) == []
    # the closest entry decides: p.web.base sits in the base room although p.web is on top
    nested: Rooms = (("p.web.base",), ("p.web",))
    assert upward_arrows({"p.web.base": {"p.web.x"}}, nested) == [("p.web.base", "p.web.x")]
    assert upward_arrows({"p.web.x": {"p.web.base"}}, nested) == []


def test_type_only_imports_count_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nimport p.a\nif TYPE_CHECKING:\n    from p import b\n"
    )
    modules = {"p.a": path, "p.b": path, "p.m": path}
    assert imports_of(path, "p.m", modules) == {"p.a"}
    assert imports_of(path, "p.m", modules, include_type_only=True) == {"p.a", "p.b"}


def test_conspo_is_a_pure_library() -> None:
    """No module of the training library imports the web app, the database or the worker."""
    graph = import_graph()
    for name, deps in graph.items():
        if name.startswith("conspo."):
            outside = {d for d in deps if d.split(".")[0] in ("backend", "worker", "conspo_lab")}
            assert not outside, f"{name} imports {sorted(outside)}"


def test_the_web_app_starts_without_scipy_torch_or_transformers(tmp_path: Path) -> None:
    """Every server and CLI start pays for what the app imports: scipy (~0.6 s, the study
    statistics), torch and transformers (seconds) wait until a page or a job needs them."""
    code = (
        "import sys, backend.main; backend.main.create_app();"
        " heavy = sorted({'scipy', 'torch', 'transformers'} & set(sys.modules));"
        " assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONSPO_DATA_DIR": str(tmp_path)}
    env.pop("CONSPO_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
