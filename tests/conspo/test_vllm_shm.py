"""vLLM's shared-memory directories (conspo.generation.shm_dirs) outlive no owner: one whose
process was killed with ``kill -9`` is removed by the next engine's start and by any cleaning
pass; one whose owner lives is kept. Real processes, real signals; no vLLM needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from conspo.config import SamplingConfig
from conspo.generation import shm_dirs, vllm_engine
from conspo.generation.shm_dirs import LOCK_NAME, VLLM_PREFIX, remove_abandoned
from conspo.generation.vllm_engine import EngineProcessError, VllmEngine

WEIGHTS = "policy.safetensors"
# What the engine does before its first push: make its directory, then write the weights in it.
OWNER = f"""
import sys
from pathlib import Path
from conspo.generation.shm_dirs import VLLM_PREFIX, make_owned_dir
owned = make_owned_dir(VLLM_PREFIX, Path(sys.argv[1]))
(owned.path / {WEIGHTS!r}).write_bytes(bytes(1 << 20))
print(owned.path, flush=True)
sys.stdin.read()  # until the test closes it (or kills this process)
"""


# A whole engine's start (``VllmEngine._start``) with an interpreter without vLLM: its server
# runs and refuses "start", and the engine holds its directory, socket and all.
ENGINE_OWNER = f"""
import sys
from pathlib import Path
import torch
from conspo.config import SamplingConfig
from conspo.generation import shm_dirs, vllm_engine
shm_dirs.ROOT = Path(sys.argv[1])
vllm_engine.vllm_python = lambda: sys.executable
engine = vllm_engine.VllmEngine(SamplingConfig(), sys.argv[2], torch.float32)
try:
    engine._start(model=None)
except vllm_engine.EngineProcessError:
    pass
(engine._dir.path / {WEIGHTS!r}).write_bytes(bytes(1 << 20))
print(engine._dir.path, flush=True)
sys.stdin.read()
"""


class Owner:
    """A process that made a directory through the engine's own code, and holds it."""

    def __init__(self, root: Path, script: str = OWNER, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, str(root), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.path = Path(self.process.stdout.readline().strip())
        assert (self.path / WEIGHTS).exists(), self.process.poll()

    def kill_9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(timeout=60) == -signal.SIGKILL

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.communicate(timeout=60)


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    started: list[Owner] = []
    yield started
    for owner in started:
        owner.process.kill()
        owner.process.wait(timeout=60)


def test_a_killed_owner_s_weights_are_removed_and_a_live_owner_s_kept(
    tmp_path: Path, owners: list[Owner]
) -> None:
    dead, live = Owner(tmp_path), Owner(tmp_path)
    owners += [dead, live]
    assert remove_abandoned(VLLM_PREFIX, tmp_path) == []  # both alive
    dead.kill_9()
    assert remove_abandoned(VLLM_PREFIX, tmp_path) == [dead.path]
    assert not dead.path.exists()
    assert (live.path / WEIGHTS).exists()
    live.stop()  # exits without removing its directory: gone all the same
    assert remove_abandoned(VLLM_PREFIX, tmp_path) == [live.path]
    assert list(tmp_path.iterdir()) == []


def test_a_directory_without_a_lock_goes_only_once_old(tmp_path: Path) -> None:
    """What this code's earlier versions left: no lock file, only an age to go by."""
    old, new = tmp_path / f"{VLLM_PREFIX}old", tmp_path / f"{VLLM_PREFIX}new"
    for path in (old, new):
        path.mkdir()
        (path / WEIGHTS).write_bytes(b"w")
    long_ago = old.stat().st_mtime - shm_dirs.UNLOCKED_GRACE_S - 1
    os.utime(old, (long_ago, long_ago))
    assert remove_abandoned(VLLM_PREFIX, tmp_path) == [old]
    assert new.exists() and not old.exists()


def test_the_engine_s_start_removes_what_a_killed_engine_left(
    tmp_path: Path, owners: list[Owner], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both engines start for real, with an interpreter without vLLM: the server runs and
    refuses 'start' after the engine has cleaned up and made its own directory."""
    # the server's socket lies in the shm directory: a short path (AF_UNIX names are at most
    # 107 bytes; pytest's tmp_path under xdist can be longer)
    shm = Path(tempfile.mkdtemp(prefix="shm-", dir="/tmp"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 8}'
    )
    dead = Owner(shm, ENGINE_OWNER, str(model))
    owners.append(dead)
    # its server (if it has not exited already, having refused 'start') sees its trainer gone
    # and exits: nothing holds the directory
    servers = psutil.Process(dead.process.pid).children()
    dead.kill_9()
    for server in servers:
        server.wait(timeout=60)
    assert (dead.path / WEIGHTS).exists()
    monkeypatch.setattr(shm_dirs, "ROOT", shm)
    monkeypatch.setattr(vllm_engine, "vllm_python", lambda: sys.executable)
    engine = VllmEngine(SamplingConfig(), model, torch.float32)
    try:
        with pytest.raises(EngineProcessError, match="vllm"):
            engine._start(model=None)  # type: ignore[arg-type]
        assert not dead.path.exists()
        (own,) = shm.iterdir()
        assert (own / LOCK_NAME).exists()
        assert remove_abandoned(VLLM_PREFIX, shm) == []  # its owner, this process, lives
    finally:
        engine.close()
    assert list(shm.iterdir()) == []
    shm.rmdir()
