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
    rlimits of the same names, per process, except the wall clock, the output caps and the two
    RAM file systems.

    What a snippet can hold in the host's memory beyond its processes' address spaces is its
    files, ``tmpfs_bytes + shm_bytes`` (``files_in_memory_bytes``: /tmp and /dev/shm are the only
    writable file systems, /dev itself is read-only), and what the kernel buffers for its pipes
    and sockets, each bounded per descriptor (``open_files``) by the kernel's own caps: a pipe
    by ``fs.pipe-max-size`` and, once the user holds ``fs.pipe-user-pages-soft`` pages in pipes,
    two pages; a Unix socket by ``net.core.wmem_max``; a loopback TCP connection by
    ``net.ipv4.tcp_wmem`` + ``tcp_rmem`` (their maxima) and host-wide by ``net.ipv4.tcp_mem``.
    """

    wall_seconds: float = 5.0
    cpu_seconds: int = 5
    address_space_bytes: int = 512 * MIB
    processes: int = 64
    file_size_bytes: int = 1 * MIB
    open_files: int = 64
    output_bytes: int = 64 * KIB  # each of stdout and stderr
    tmpfs_bytes: int = 64 * MIB  # the writable /tmp, held in the host's memory
    # The writable /dev/shm (POSIX shared memory: multiprocessing's locks and queues), held in
    # the host's memory as well: its own capped tmpfs, never the uncapped /dev bwrap makes.
    shm_bytes: int = 16 * MIB

    def __post_init__(self) -> None:
        # A tmpfs of size 0 has no cap at all, and a zero rlimit or timeout no meaning.
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")

    @property
    def files_in_memory_bytes(self) -> int:
        """The most the snippet's files can take of the host's memory: both tmpfs caps."""
        return self.tmpfs_bytes + self.shm_bytes


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
