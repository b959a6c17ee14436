"""What a sandboxed run takes and gives back: a snippet, its limits, its result, the refusal."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Snippet:
    source: str  # Python source text, run as a script
    stdin: str = ""  # fed to the snippet's standard input


@dataclass(frozen=True)
class Limits:
    """Per snippet. Processes count every thread and process of the snippet together (a pids
    cgroup when one can be made, else RLIMIT_NPROC of a non-root caller); the others are the
    rlimits of the same names, per process, except the wall clock and the output caps."""

    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    address_space_bytes: int = 512 * MIB
    processes: int = 64
    file_size_bytes: int = 1 * MIB
    open_files: int = 64
    output_bytes: int = 64 * KIB  # each of stdout and stderr
    tmpfs_bytes: int = 64 * MIB  # the writable /tmp, held in the host's memory


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int  # negative: killed by that signal (as subprocess reports it)
    timed_out: bool  # killed at the wall-clock limit
    stdout_truncated: bool
    stderr_truncated: bool
    wall_seconds: float
    cpu_seconds: float  # user + system of the sandbox and every child it reaped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class SandboxUnavailable(RuntimeError):
    """No working sandbox on this machine, and the caller did not opt into running unsafely."""
