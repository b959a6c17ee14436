"""The model store: where policies come from, the built-ins built once into a local directory.

The store knows how to keep a built model, not how to make one: its ``builder`` is handed in,
and the library's is ``conspo.models.builtins.build_builtin`` (the recipes: `tiny`, `tiny-chat`,
SmolLM2 from its package, and the warm-started ones, which train), so that this room imports
nothing of training. What each built-in name is lives in conspo/models/catalog.py.

    store = builtin_store()                   # $CONSPO_MODEL_STORE or ~/.cache/conspo/models
    path = store.resolve("tiny-arith")        # built once, then reused by every run

Other names load from a local directory or the hub; a store made with
``ModelStore(root, ModelSources(roots=..., hub_allow=...))`` admits only those its sources allow
(conspo.access: a worker passes its operator's), and refuses any other before transformers runs.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from conspo.access import ModelSources, Unavailable
from conspo.config import ModelConfig
from conspo.models.catalog import BUILTIN_MODELS
from conspo.models.loading import load_pretrained, pick_device

# Bumped whenever what the store builds changes (architecture, tokenizer, SFT recipe): a store
# directory built under another version is rebuilt on its next resolve(). 2: Qwen2, byte-level
# character tokenizer, SFT lr 1e-3 (1: Qwen3, WordLevel tokenizer, SFT lr 5e-3).
STORE_VERSION = 2
MARKER = "BUILT_BY_CONSPO"


# builder(name, resolve) -> build(out): how to write the built-in ``name`` into the directory
# ``out``; ``resolve(base)`` is the path of another built-in it starts from (built first).
Builder = Callable[[str, Callable[[str], Path]], Callable[[Path], object]]


class ModelStore:
    """A directory of built models, one sub-directory per name, each built at most once.

    Builds run under an exclusive file lock and land in a temp dir that is renamed into place,
    so two worker processes resolving the same name never build it twice or see half a model.
    """

    def __init__(
        self,
        root: str | Path | None = None,
        sources: ModelSources | None = None,
        builder: Builder | None = None,
    ) -> None:
        """``sources``: where other models may load from (default: any directory, any hub id);
        ``builder``: the built-ins' recipes (``conspo.models.builtins.build_builtin``; None: a
        store that refuses built-in names)."""
        root = root or os.environ.get("CONSPO_MODEL_STORE") or "~/.cache/conspo/models"
        self.root = Path(root).expanduser()
        self.sources = sources or ModelSources()
        self.builder = builder

    def builtin_names(self) -> list[str]:
        return list(BUILTIN_MODELS)

    def resolve(self, name: str) -> Path | str:
        """Local path of a built-in or local model; a hub id is returned as is (cached or not).

        A name ``sources`` does not admit raises ``Unavailable`` here, before transformers sees it.
        """
        source = self.sources.locate(name)
        if source.kind == "builtin":
            return self._builtin(name)
        return source.path or name  # a hub id: from_pretrained decides whether it is cached

    def _builtin(self, name: str) -> Path:
        if self.builder is None:
            raise Unavailable(
                f"model.name {name!r} is a built-in model, and this model store has no builder"
                " for built-ins (conspo.models.builtins.builtin_store makes one that has)"
            )
        return self._build_once(name, self.builder(name, self._builtin))

    def _build_once(self, name: str, build: Callable[[Path], object]) -> Path:
        final = self.root / name
        if _is_current(final):
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.root / f".{name}.lock"):
            if _is_current(final):  # another process built it while we waited
                return final
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
            stale = None
            try:
                build(tmp)
                (tmp / MARKER).write_text(f"{name}\nversion {STORE_VERSION}\n")
                if final.exists():  # built by another STORE_VERSION: move it aside, then swap
                    stale = Path(tempfile.mkdtemp(prefix=f".{name}-stale-", dir=self.root))
                    os.replace(final, stale / name)
                os.replace(tmp, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
                if stale is not None:
                    shutil.rmtree(stale, ignore_errors=True)
        return final


def _is_current(path: Path) -> bool:
    """A complete build of this STORE_VERSION (older builds lack the version line)."""
    marker = path / MARKER
    if not (path / "config.json").exists() or not marker.exists():
        return False
    return f"version {STORE_VERSION}" in marker.read_text().splitlines()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_policy(
    cfg: ModelConfig, store: ModelStore | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, torch.device, torch.dtype]:
    """Resolve ``cfg.name`` through the store and load it on the auto-selected device."""
    store = store or ModelStore()  # local directories and hub ids; hand a builder for built-ins
    device, dtype = pick_device(cfg)
    model, tokenizer = load_pretrained(store.resolve(cfg.name), device, dtype)
    return model, tokenizer, device, dtype
