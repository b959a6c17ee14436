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

    Memory, where a memory cgroup can be made (``sandbox_available`` says): all the snippet's
    processes together, with their files, SysV shared memory, pipe and socket buffers, at most
    ``memory_budget_bytes`` (cgroup v1 counts TCP buffers apart, against a limit of the same
    size). Where none can be made, each process is bounded by its address
    space, and beyond them the snippet holds its files, ``files_in_memory_bytes`` (/tmp and
    /dev/shm are its only writable file systems: /dev itself is read-only), SysV shared memory
    detached from every process (unbounded: its IPC namespace's default limits), and what the
    kernel buffers for its descriptors (``open_files`` each process): a pipe at most
    ``fs.pipe-max-size`` (1 MiB), two pages once the user holds ``fs.pipe-user-pages-soft``
    (64 MiB) in pipes; a Unix socket about ``net.core.wmem_max``; a loopback TCP connection up to
    ``net.ipv4.tcp_wmem`` + ``tcp_rmem`` (their maxima), host-wide at most ``net.ipv4.tcp_mem``.
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

    @property
    def memory_budget_bytes(self) -> int:
        """The memory cgroup's limit: what one process may address, plus room for the files."""
        return self.address_space_bytes + self.files_in_memory_bytes


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
