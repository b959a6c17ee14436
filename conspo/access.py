"""What a run's config may make a process read: dataset files and models.

A config names files (``task.params.path``) and models (``model.name``) on the machine that
trains it. On your own machine (the CLI, a notebook) that may be anything you can read, which is
the default here. A shared worker trains configs written by others, so its operator bounds both
and passes the bounds in: a ``DataFiles`` (data roots, a size cap) to the task, a
``ModelSources`` (model roots, a hub allowlist) to the model store. The platform's API checks the
same at submit time. Torch-free: the API process imports it.

    files = DataFiles(roots=(Path("/data/datasets"),), max_bytes=2**28)
    text = files.read_text("gsm8k/train.jsonl")          # /data/datasets/gsm8k/train.jsonl
    ModelSources(roots=(Path("/models"),), hub_allow=("Qwen/*",)).locate("Qwen/Qwen2.5-0.5B")

A name that may not be read is refused with one message whether it is missing, outside every
root or not a regular file (a directory, /dev/zero, a FIFO), so the error reveals nothing about
files the config may not read.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from conspo.models.catalog import BUILTIN_MODELS

DEFAULT_MAX_DATASET_BYTES = 256 * 2**20
# Hugging Face repo ids: [namespace/]name, letters, digits, '-', '_', '.', no '..' or '--'
# (huggingface_hub's validate_repo_id), so a path such as ../../x is never taken for one.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


class Unavailable(FileNotFoundError):
    """A file or model that a config names and that this process may not, or cannot, read.

    One error for "missing" and "not allowed": telling them apart would let a config probe for
    files outside the allowed places.
    """


class DatasetTooLarge(ValueError):
    """An allowed dataset file over the size cap."""


def _resolved(path: Path) -> Path | None:
    """``path`` with every symlink resolved; None for a name that cannot be a path here."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte, a name too long
        return None


def _inside(path: Path, roots: tuple[Path, ...] | None) -> bool:
    if roots is None:
        return True
    return any(path.is_relative_to(real) for root in roots if (real := _resolved(root)))


def _candidates(name: str, roots: tuple[Path, ...] | None) -> list[Path]:
    """Where ``name`` may be: itself when absolute or unbounded, else inside each root in turn."""
    path = Path(name)
    if roots is None:
        return [path.expanduser()]
    return [path] if path.is_absolute() else [root / path for root in roots]


def _find(name: str, roots: tuple[Path, ...] | None, kind: Literal["file", "dir"]) -> Path | None:
    """The first candidate that, symlinks resolved, is inside a root and is a ``kind``."""
    for candidate in _candidates(name, roots):
        real = _resolved(candidate)
        if real is None or not _inside(real, roots):
            continue
        try:
            if real.is_file() if kind == "file" else real.is_dir():
                return real
        except OSError:  # unreadable parent directory, name too long: not available either way
            continue
    return None


@dataclass(frozen=True)
class DataFiles:
    """Where dataset files may be read from, and how much of one.

    ``roots`` None reads anywhere (the library on your own machine); otherwise a relative name is
    looked up inside each root in turn and an absolute one must lie inside a root, symlinks
    resolved first, so neither ``..`` nor a symlink leads out. Only regular files are read, at
    most ``max_bytes`` of them.
    """

    roots: tuple[Path, ...] | None = None
    max_bytes: int = DEFAULT_MAX_DATASET_BYTES

    def check(self, name: str) -> Path:
        """The file ``name`` resolves to, or ``Unavailable`` / ``DatasetTooLarge``."""
        real = _find(name, self.roots, "file")
        if real is None:
            raise Unavailable(self._unavailable(name))
        self._check_size(name, real.stat().st_size)
        return real

    def check_path(self, name: str) -> Path:
        """Like ``check``, but ``name`` may also be a directory (a ``save_to_disk`` dataset,
        parquet shards): its size is the total of its files, and one holding a symlink or
        anything but regular files and directories is refused (nothing read through it may
        lead outside the roots)."""
        real = _find(name, self.roots, "file") or _find(name, self.roots, "dir")
        if real is None:
            raise Unavailable(self._unavailable(name, "file or directory"))
        size = real.stat().st_size if real.is_file() else _tree_size(real)
        if size is None:
            raise Unavailable(self._unavailable(name, "file or directory"))
        self._check_size(name, size)
        return real

    def read_text(self, name: str) -> str:
        """The UTF-8 text of the file ``name``, read with a bound whatever the file claims."""
        real = self.check(name)
        # O_NOFOLLOW / O_NONBLOCK: a file swapped for a symlink or a FIFO after the check is
        # neither followed nor waited on; fstat then checks what was actually opened.
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(real, flags)
        except OSError:
            raise Unavailable(self._unavailable(name)) from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise Unavailable(self._unavailable(name))
            data = f.read(self.max_bytes + 1)
        self._check_size(name, len(data))
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name}: not UTF-8 text (byte {exc.start})") from None

    def _check_size(self, name: str, size: int) -> None:
        if size > self.max_bytes:
            raise DatasetTooLarge(
                f"dataset {name!r} is over the size cap of {self.max_bytes:,} bytes"
            )

    def _unavailable(self, name: str, kind: str = "regular file") -> str:
        where = "inside the data roots" if self.roots is not None else "here"
        return f"dataset {name!r} is not a readable {kind} {where}"


def _tree_size(directory: Path) -> int | None:
    """Total bytes of the regular files under ``directory``; None if it holds anything else."""
    total = 0
    for parent, dirs, names in os.walk(directory):
        for entry in [*dirs, *names]:
            mode = os.lstat(os.path.join(parent, entry)).st_mode
            if stat.S_ISLNK(mode) or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                return None
            if stat.S_ISREG(mode):
                total += os.lstat(os.path.join(parent, entry)).st_size
    return total


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["builtin", "local", "hub"]
    name: str  # model.name as given
    path: Path | None = None  # kind "local": the model directory, symlinks resolved


@dataclass(frozen=True)
class ModelSources:
    """Where models may load from: a built-in name, a model directory (one holding config.json)
    inside ``roots``, or a hub id that ``hub_allow`` admits.

    ``roots`` None: any local directory; ``hub_allow`` None: any hub id (the library on your own
    machine). An allowlist entry is a hub id, or a prefix ending in ``*`` (``Qwen/*``).
    """

    roots: tuple[Path, ...] | None = None
    hub_allow: tuple[str, ...] | None = None

    def locate(self, name: str) -> ModelSource:
        """Where ``name`` loads from, or ``Unavailable`` before anything reads it."""
        if name in BUILTIN_MODELS:
            return ModelSource("builtin", name)
        directory = _find(name, self.roots, "dir")
        if directory is not None and (directory / "config.json").is_file():
            return ModelSource("local", name, directory)
        if is_hub_id(name) and self.hub_allowed(name):
            return ModelSource("hub", name)
        raise Unavailable(self._unavailable(name))

    def hub_allowed(self, hub_id: str) -> bool:
        if self.hub_allow is None:
            return True
        return any(
            hub_id == entry or (entry.endswith("*") and hub_id.startswith(entry[:-1]))
            for entry in self.hub_allow
        )

    def _unavailable(self, name: str) -> str:
        builtins = ", ".join(BUILTIN_MODELS)
        if self.roots is None and self.hub_allow is None:
            return (
                f"model.name {name!r}: no such model directory (with config.json), and not a"
                f" model-store name ({builtins}) or a hub id"
            )
        hub = (
            "any hub id"
            if self.hub_allow is None
            else f"a hub id the operator allows ({', '.join(self.hub_allow) or 'none are'})"
        )
        local = "a model directory" + ("" if self.roots is None else " in the model roots")
        return (
            f"model.name {name!r} is not available here: use a model-store name ({builtins}),"
            f" {local} (with config.json), or {hub}"
        )


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and ".." not in name and "--" not in name


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
