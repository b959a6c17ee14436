"""The run's log: what its training process prints, captured while the worker trains it.

``RunLogCapture`` points this process's stdout and stderr — file descriptors 1 and 2, so the
output of C and CUDA libraries and of the processes it starts (a DDP run's ranks) is caught too,
not only Python's — at a file of the attempt's own, opened for appending. Writes to a file never
wait for a reader, so a training thread that prints while holding the interpreter lock cannot
stall on this. A tailer thread reads the file every ``interval_s``, echoes what it read to the
worker's own stderr (its console and log stay as they were), redacts secrets, and appends the
whole lines to the run's log in the database (``backend.storage.run_logs``, which bounds it).

Bounds: the disk space of what the tailer has read is given back once it is past
``ROTATE_BYTES`` (a hole punched over it: the file keeps its size, so what a writer appends
meanwhile is kept, where a truncation lost it; ``punch_hole``); a tick reads at most
``TICK_BYTES`` and skips the rest with a line saying how much (a run printing faster than a
log can usefully keep); text the database could not take (an outage) waits, up to
``PENDING_BYTES``. Nothing here can fail the run: a write that fails is reported on the
worker's stderr and retried with the next tick.

Secrets never reach the log: the worker's own settings' URLs and every environment value whose
name says token, secret, password or key are replaced by ``***`` wherever they appear, and so are
the credentials of any URL, bearer tokens and ``token=…``-style assignments.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import re
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from backend.db import Database
from backend.storage import run_logs

log = logging.getLogger(__name__)

ROTATE_BYTES = 8 * 2**20
TICK_BYTES = 2**20
CHUNK_BYTES = 256 * 1024  # text per stored chunk
PENDING_BYTES = 4 * 2**20  # > TICK_BYTES: only text the database did not take is dropped

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|PRIVATE|CREDENTIAL", re.IGNORECASE)
PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host → scheme://user:***@host
    (re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@"), r"\1***@"),
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1***"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), "hf_***"),
    (
        re.compile(
            r"(?i)\b((?:[a-z_]*token|password|passwd|secret|api[_-]?key)\s*[=:]\s*)"
            r"(['\"]?)[^\s'\"]{4,}\2"
        ),  # fmt: skip
        r"\1\2***\2",
    ),
)


class Redactor:
    def __init__(self, secrets: Iterable[str]) -> None:
        # longest first: a URL is replaced whole before its password alone is
        self.secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        for pattern, replacement in PATTERNS:
            text = pattern.sub(replacement, text)
        return text


def secrets_of(settings: object) -> list[str]:
    """What must never be printed: the settings' URLs (whole, and their passwords) and every
    environment value whose name sounds secret."""
    found = [str(v) for k, v in os.environ.items() if SECRET_NAME.search(k)]
    for name in ("database_url", "broker_url", "result_backend", "redis_url"):
        value = getattr(settings, name, None)
        if value:
            url = str(value)
            found.append(url)
            if m := re.match(r"[^:]+://[^:/@]*:([^@/]+)@", url):
                found.append(m.group(1))
    return found


class RunLogCapture:
    """A context: fds 1 and 2 go to ``path`` while it is open, and its lines to the run's log."""

    def __init__(
        self,
        db: Database,
        run_id: int,
        attempt: int,
        path: Path,
        redact: Redactor,
        interval_s: float = 1.0,
    ) -> None:
        self.db, self.run_id, self.attempt = db, run_id, attempt
        self.path, self.redact, self.interval_s = path, redact, interval_s
        self._saved: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._offset = 0  # the file's bytes before it are read
        self._freed = 0  # those before it are a hole (their disk space given back)
        self._partial = b""
        self._pending = ""
        self._streams: tuple[object, object] = (sys.stdout, sys.stderr)

    def __enter__(self) -> RunLogCapture:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")
        _flush_python_streams()
        target = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for fd in (1, 2):
                self._saved[fd] = os.dup(fd)
                os.dup2(target, fd)
        finally:
            os.close(target)
        # Python's own streams write to the file too, whatever replaced them before (Celery's
        # logging proxy, a test runner's capture): print() lands in the log like the rest.
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")  # noqa: SIM115
        self._thread = threading.Thread(target=self._follow, name="run-log", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _flush_python_streams()
        ours = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = self._streams
        for stream in ours:
            with contextlib.suppress(Exception):
                stream.close()  # closefd=False: the descriptor stays
        for fd, saved in self._saved.items():  # the worker's own streams again
            os.dup2(saved, fd)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._tick(final=True)
        for saved in self._saved.values():
            os.close(saved)
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _follow(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick(final=False)

    def _tick(self, final: bool) -> None:
        try:
            data = self._read()
        except OSError as exc:
            self._complain(f"run {self.run_id}: its log file could not be read: {exc}")
            return
        if data:
            self._echo(data)
        data = self._partial + data
        if final:
            whole, self._partial = data, b""
        else:
            # A carriage return ends a line as a newline does: a progress bar (tqdm) redraws
            # its one line after each \r and writes its newline only when it is done, so held
            # back to a newline it would show nothing until the end. The Logs tab draws \r as a
            # terminal does.
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            whole, self._partial = data[:cut], data[cut:]
            if len(self._partial) > CHUNK_BYTES:  # one endless line: stored as it is
                whole, self._partial = data, b""
        text = self.redact(whole.decode("utf-8", errors="replace"))
        if final and text and not text.endswith("\n"):
            text += "\n"
        self._pending = (self._pending + text)[-PENDING_BYTES:]
        self._store()

    def _read(self) -> bytes:
        size = self.path.stat().st_size
        if size < self._offset:  # truncated by us (_rotate): start again from its head
            self._offset = self._freed = 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            if size - self._offset <= TICK_BYTES:
                data = f.read(size - self._offset)
            else:
                # More than a tick keeps: its oldest and newest halves, whole lines, and a line
                # between them saying what was skipped (how it started and how it is going
                # are what a reader wants).
                half = TICK_BYTES // 2
                first = f.read(half)
                first = first[: first.rfind(b"\n") + 1]
                f.seek(size - half)
                f.readline()
                skipped = f.tell() - self._offset - len(first)
                marker = (f"[… {skipped:,} bytes of output skipped: the run printed faster than"
                          " its log keeps …]\n").encode()  # fmt: skip
                data = first + marker + f.read(size - f.tell())
            self._offset = f.tell()
        if self._offset - self._freed >= ROTATE_BYTES:
            self._rotate()
        return data

    def _rotate(self) -> None:
        """Give back the disk space of what has been read.

        Writers append (O_APPEND) at the file's end, in this process and in the processes it
        started, none under a lock of ours: whatever the tailer does to the file, they may be
        writing. A hole punched over what has been read keeps the file's size, so their place
        and the tailer's stay where they were and what they wrote meanwhile is read next tick.
        A truncation instead threw away what they wrote after the read above (the tail of a run
        that ended meanwhile): only where the filesystem cannot punch holes is it the fallback,
        that loss (a few lines at most) included."""
        try:
            punch_hole(self.path, self._freed, self._offset)
            self._freed = self._offset
        except OSError:
            os.truncate(self.path, 0)
            self._offset = self._freed = 0

    def _store(self) -> None:
        if not self._pending:
            return
        try:
            with self.db.session() as session:
                text = self._pending
                while text:
                    piece, text = _split(text, CHUNK_BYTES)
                    run_logs.append(session, self.run_id, self.attempt, piece)
                session.commit()
            self._pending = ""
        except Exception as exc:  # noqa: BLE001 — an outage: kept, retried with the next tick
            self._complain(f"run {self.run_id}: its log could not be stored yet: {exc}")

    def _echo(self, data: bytes) -> None:
        saved = self._saved.get(2)
        if saved is not None:
            with contextlib.suppress(OSError):
                os.write(saved, data)

    def _complain(self, message: str) -> None:
        self._echo((message + "\n").encode())


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02  # linux/falloc.h


def punch_hole(path: Path, start: int, end: int) -> None:
    """Give back the disk blocks of bytes [start, end) of ``path``, its size unchanged (they
    read as zeros): Linux's fallocate(2). OSError where the system or the filesystem cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    fallocate = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if fallocate is None:
        raise OSError(errno.ENOSYS, "no fallocate on this system")
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fd = os.open(path, os.O_WRONLY)
    try:
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if fallocate(fd, mode, start, end - start) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)


def _split(text: str, limit: int) -> tuple[str, str]:
    """A first piece of at most ``limit`` bytes ending at a line break when one is near."""
    if len(text.encode()) <= limit:
        return text, ""
    head = text.encode()[:limit].decode("utf-8", errors="ignore")
    cut = head.rfind("\n") + 1 or len(head)
    return text[:cut], text[cut:]


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
