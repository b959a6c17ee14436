"""Local ranks: ``train`` on several processes of this machine (``conspo.launch.launch`` picks
it for ``resources.gpus`` > 1).

    result = launch_local(config, sink, should_stop, workdir="out", nprocs=2)

The launcher runs rank 0 in the calling process (the worker's sink, heartbeat and cancel keep
working) and ranks 1..n-1 as ``python -m conspo.launch.local`` children that die with their
parent (``PR_SET_PDEATHSIG``: the signal follows the *thread* that started them, so call it from a
thread that lives as long as the run, e.g. the Celery task's); a child that fails fails the run
with its own traceback. gloo notices a dead peer at once; NCCL may only at the collective
timeout (``timeout_s``).
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from conspo.distributed.collectives import DEFAULT_TIMEOUT_S, JOIN_TIMEOUT_S
from conspo.sink import NullSink, Sink

if TYPE_CHECKING:
    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.training.loop import TrainResult

# --------------------------------------------------------------------------------------------
# The local launcher
# --------------------------------------------------------------------------------------------


class RankFailed(RuntimeError):
    """A child rank of ``launch_local`` failed; the message carries its traceback."""


def launch_local(
    config: RunConfig,
    sink: Sink,
    should_stop: Callable[[], bool] = lambda: False,
    *,
    workdir: str | Path,
    nprocs: int,
    model_store: ModelStore | None = None,
    files: DataFiles | None = None,
    memory_limit: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TrainResult:
    """``train`` on ``nprocs`` (≥ 2) processes of this machine: rank 0 here, the others children.

    gloo on the CPU, NCCL with one CUDA device per rank when the config trains on CUDA. The
    group is destroyed and every child reaped before this returns or raises; a child's failure
    (its exit code and traceback) becomes this call's ``RankFailed``.
    """
    from conspo.training.trainer import train

    where: dict[str, Any] = {"workdir": workdir, "model_store": model_store, "files": files}
    if nprocs < 2:
        raise ValueError(f"launch_local: nprocs is {nprocs}; one process trains without it")
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("launch_local: this process is already in a process group")
    cuda = _on_cuda(config, nprocs)
    backend = "nccl" if cuda else "gloo"
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        nprocs,
        is_master=True,
        timeout=timedelta(seconds=JOIN_TIMEOUT_S),
        wait_for_workers=False,
    )
    scratch = Path(tempfile.mkdtemp(prefix="conspo-ranks-"))
    spec = {
        **where,
        "config": config,
        "workdir": str(workdir),
        "memory_limit": memory_limit,
        "port": store.port,
        "world": nprocs,
        "backend": backend,
        "timeout_s": timeout_s,
        "threads": torch.get_num_threads(),
    }
    (scratch / "spec.pkl").write_bytes(pickle.dumps(spec))
    children = [_spawn(r, scratch) for r in range(1, nprocs)]
    try:
        _await_children(store, children, scratch)
        if cuda:
            torch.cuda.set_device(0)
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend, store=store, rank=0, world_size=nprocs, timeout=timeout)
        try:
            result = train(config, sink, should_stop, memory_limit=memory_limit, **where)
        finally:
            dist.destroy_process_group()
        _wait_children(children, scratch, timeout=JOIN_TIMEOUT_S)
        return result
    except BaseException as exc:
        failure = _child_failure(children, scratch, grace=30.0)
        if failure is not None and not isinstance(exc, RankFailed):
            raise RankFailed(failure) from exc
        raise
    finally:
        _reap(children, scratch)


def _on_cuda(config: RunConfig, nprocs: int) -> bool:
    """Whether the ranks train on CUDA (one device each: refused when there are too few)."""
    from conspo.models.loading import pick_device

    cuda = pick_device(config.model)[0].type == "cuda"
    if cuda and torch.cuda.device_count() < nprocs:
        raise RuntimeError(
            f"resources.gpus is {nprocs} but this machine has {torch.cuda.device_count()} CUDA"
            " devices"
        )
    return cuda


def _reap(children: list[subprocess.Popen[bytes]], scratch: Path) -> None:
    """Kill the children still running and remove the scratch directory."""
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()
    for path in scratch.iterdir():
        path.unlink()
    scratch.rmdir()


def _spawn(rank_: int, scratch: Path) -> subprocess.Popen[bytes]:
    """Rank ``rank_`` as a child that dies with this process (``PR_SET_PDEATHSIG``)."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "conspo.launch.local", str(scratch), str(rank_)],
        env=env,
        preexec_fn=_die_with_parent,
        stdin=subprocess.DEVNULL,
    )


def _await_children(
    store: dist.TCPStore, children: list[subprocess.Popen[bytes]], scratch: Path
) -> None:
    """Wait until every child has reached the store, failing as soon as one has died:
    ``init_process_group`` itself would wait for a dead child until its timeout."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    waiting = [f"joined/{r}" for r in range(1, len(children) + 1)]
    while not store.check(waiting):
        failure = _child_failure(children, scratch, grace=0.0)
        if failure is not None:
            raise RankFailed(failure)
        if any(c.poll() is not None for c in children):
            raise RankFailed("a rank exited before joining the group")
        if time.monotonic() > deadline:
            raise RankFailed(f"the ranks did not start within {JOIN_TIMEOUT_S:.0f} s")
        time.sleep(0.05)


def _die_with_parent() -> None:
    """In the child between fork and exec: SIGKILL when the parent dies (Linux), so a
    ``kill -9`` of the worker leaves no rank blocked in a collective."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _wait_children(children: list[subprocess.Popen[bytes]], scratch: Path, timeout: float) -> None:
    """Every child exits (they finish with rank 0); a non-zero exit is ``RankFailed``."""
    deadline = time.monotonic() + timeout
    for child in children:
        child.wait(timeout=max(0.0, deadline - time.monotonic()))
    failure = _child_failure(children, scratch, grace=0.0)
    if failure is not None:
        raise RankFailed(failure)


def _child_failure(
    children: list[subprocess.Popen[bytes]], scratch: Path, grace: float
) -> str | None:
    """The first failed child's exit code and traceback, waiting up to ``grace`` seconds for
    the children to exit (rank 0's error may be the echo of a child's: a closed connection)."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        if any((scratch / f"rank{r}.err").exists() for r in range(1, len(children) + 1)):
            break  # a child's own error is written before it leaves the group (_child_main)
        time.sleep(0.05)
    for r, child in enumerate(children, start=1):
        code = child.poll()
        report = scratch / f"rank{r}.err"
        if report.exists():
            detail = _read_report(report)
            how = "failed" if code is None else f"exited with code {code}"
            return f"rank {r} {how}:\n{detail}"
        if code is not None and code != 0:
            return f"rank {r} exited with code {code}:\n(no traceback: killed?)"
    return None


def _read_report(report: Path) -> str:
    """A child's traceback (written whole, then renamed into place: ``_report``)."""
    return report.read_text()


def _child_main(scratch: Path, rank_: int) -> None:
    """A child rank: join the group, train with a sink that drops everything, report failure."""
    from conspo.training.trainer import train

    try:
        spec = pickle.loads((scratch / "spec.pkl").read_bytes())
        torch.set_num_threads(spec["threads"])
        if spec["backend"] == "nccl":
            torch.cuda.set_device(rank_)
        store = dist.TCPStore(
            "127.0.0.1",
            spec["port"],
            spec["world"],
            is_master=False,
            timeout=timedelta(seconds=JOIN_TIMEOUT_S),
        )
        store.set(f"joined/{rank_}", "1")
        dist.init_process_group(
            spec["backend"],
            store=store,
            rank=rank_,
            world_size=spec["world"],
            timeout=timedelta(seconds=spec["timeout_s"]),
        )
        try:
            train(
                spec["config"],
                NullSink(),
                workdir=spec["workdir"],
                model_store=spec["model_store"],
                files=spec["files"],
                memory_limit=spec["memory_limit"],
            )
        except BaseException:
            # Said before leaving the group: leaving closes rank 0's connections, and rank 0
            # then looks for this report (on a loaded machine the exit itself may come late).
            _report(scratch, rank_)
            raise
        finally:
            dist.destroy_process_group()
    except BaseException:
        if not (scratch / f"rank{rank_}.err").exists():
            _report(scratch, rank_)
        sys.exit(1)


def _report(scratch: Path, rank_: int) -> None:
    """This child's traceback as rank{rank}.err, written whole then renamed into place, so
    rank 0 never reads half of it."""
    partial = scratch / f"rank{rank_}.err.partial"
    partial.write_text(traceback.format_exc()[-20_000:])
    partial.rename(scratch / f"rank{rank_}.err")


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]), int(sys.argv[2]))
