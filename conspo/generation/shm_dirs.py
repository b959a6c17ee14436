"""Directories in shared memory that outlive no owner: what the vLLM engine keeps its socket and
the policy's weights in (``/dev/shm/conspo-vllm-*``, ~270 MB at SmolLM2).

A RAM file system keeps whatever a process killed with ``kill -9`` left in it until someone
removes it, and the out-of-memory kill that ends workers is exactly such a death. So each
directory holds ``owner.lock``, on which its owner keeps an exclusive ``flock`` for as long as it
lives: the kernel drops the lock with the owner's last descriptor, whatever killed it, in
whichever PID namespace it ran. ``remove_abandoned`` removes the directories whose lock it can
take; the engine calls it at every start and the worker's reaper on every pass.

Standard library only: the reaper imports this without torch.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/dev/shm")
VLLM_PREFIX = "conspo-vllm-"
LOCK_NAME = "owner.lock"
# A directory without a lock is an owner's between its mkdtemp and its lock (microseconds), or
# one left by a version of this code that made none: only the latter is ever this old.
UNLOCKED_GRACE_S = 600.0


def shm_root() -> Path:
    """Shared memory where the system has it, else the temporary directory."""
    return ROOT if ROOT.is_dir() else Path(tempfile.gettempdir())


@dataclass
class OwnedDir:
    """A directory and the descriptor whose lock says its owner lives."""

    path: Path
    lock_fd: int | None

    def remove(self) -> None:
        """Remove the directory, then let go of its lock; a second call does nothing (the
        descriptor's number may belong to another file by then)."""
        if self.lock_fd is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self.lock_fd)
        self.lock_fd = None


def make_owned_dir(prefix: str, root: Path | None = None) -> OwnedDir:
    """A private fresh directory under ``root`` (default ``shm_root()``), locked by this process.

    The lock file is locked under a temporary name and then renamed into place, so a cleaner
    never finds ``owner.lock`` unlocked while its owner lives."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root or shm_root()))
    unnamed = path / f".{LOCK_NAME}.{os.getpid()}"
    # Not inherited (O_CLOEXEC): a child exec'd by the owner (vLLM's process) must not keep the
    # directory alive past the owner.
    fd = os.open(unnamed, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(unnamed, path / LOCK_NAME)
    except OSError:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return OwnedDir(path, fd)


def remove_abandoned(prefix: str, root: Path | None = None) -> list[Path]:
    """Remove the ``prefix*`` directories under ``root`` (default ``shm_root()``) whose owner is
    gone; returns them. Symlinks, and directories not ours to open, are left alone."""
    removed = []
    for path in (root or shm_root()).glob(f"{prefix}*"):
        if path.is_symlink() or not path.is_dir():
            continue
        gone, lock_fd = _owner_gone(path)
        if gone:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        if lock_fd is not None:  # held until the directory is gone: no owner can reuse it
            os.close(lock_fd)
    return removed


def _owner_gone(path: Path) -> tuple[bool, int | None]:
    """Whether ``path``'s owner is gone, and then the descriptor of its lock, taken."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            return time.time() - path.stat().st_mtime > UNLOCKED_GRACE_S, None
        except OSError:
            return False, None
    except OSError:  # not ours to open
        return False, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its owner lives
        os.close(fd)
        return False, None
    return True, fd
