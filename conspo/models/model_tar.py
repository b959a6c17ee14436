"""A model directory as one tar archive, streamed (a download of an exported model): its size
is known before the first byte, any byte range of it can be sent without the bytes before it
(a resumed download), and no more than one read block is ever held in memory.

The archive is a function of the directory's listing (names, sizes, whole-second mtimes) and its
files' bytes, so every request for it gets the same bytes: a client may stitch ranges of several
responses. Its SHA-256 is computed by reading it once and kept beside the directory
(``checksum``), keyed on the listing, so a second download does not read it again.

Standard library only: the web app serves downloads without importing torch or transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

BLOCK = tarfile.BLOCKSIZE  # 512: every member's data is padded to a whole number of these
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
READ_BYTES = 1 << 20

# A stretch of the archive: given (skip, n), ``n`` of its bytes from ``skip`` on, in chunks.
_Piece = Callable[[int, int], Iterator[bytes]]


class ModelTar:
    """The directory ``root`` as an uncompressed tar (weights hardly compress) whose members
    sit under ``top/``: ``tar -xf`` it and ``from_pretrained("top")`` loads.

        archive = ModelTar(Path("exports/run-7-last"), "run-7-last")
        archive.size                          # bytes, for Content-Length
        for chunk in archive.chunks(): ...    # headers and file contents, in order
        for chunk in archive.chunks(100): ... # the same bytes from offset 100 on
    """

    def __init__(self, root: Path, top: str) -> None:
        # (header, path or None for a directory, its size) in archive order
        self.members: list[tuple[bytes, Path | None, int]] = []
        listing = hashlib.sha256()
        for path in sorted(root.rglob("*")):
            # Regular files and directories only: what an export writes (a link is not
            # followed out of the directory).
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                continue
            info = tarfile.TarInfo(f"{top}/{path.relative_to(root).as_posix()}")
            stat = path.stat()
            info.mtime = int(stat.st_mtime)
            if path.is_dir():
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.size, info.mode = stat.st_size, 0o644
            header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            self.members.append((header, path if info.isfile() else None, info.size))
            # the header names the size and the whole-second mtime; the nanoseconds catch a
            # file rewritten within the same second
            listing.update(header + str(stat.st_mtime_ns).encode() + b"\0")
        self.size = len(END_OF_ARCHIVE) + sum(
            len(header) + _padded(size) for header, _, size in self.members
        )
        self.listing = listing.hexdigest()
        """What the archive is made of, as a hex digest: when it changes, so may the bytes."""

    def chunks(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The archive's bytes ``[start, end)`` (``end`` defaults to ``self.size``), read from the
        disk as they are sent: a member wholly before ``start`` is skipped without being opened.
        A file whose size changed since the listing raises (its header would lie about it)."""
        end = self.size if end is None else end
        if not 0 <= start <= end <= self.size:
            raise ValueError(f"bytes [{start}, {end}) are not within the archive's {self.size}")
        offset = 0  # of the current piece in the archive
        for piece_size, piece in self._pieces():
            if offset + piece_size > start and offset < end:
                skip = max(start - offset, 0)
                yield from piece(skip, min(end - offset, piece_size) - skip)
            offset += piece_size
            if offset >= end:
                return

    def _pieces(self) -> Iterator[tuple[int, _Piece]]:
        """The archive as consecutive (length, piece)."""
        for header, path, size in self.members:
            yield len(header), _constant(header)
            if path is None:
                continue
            yield size, _file_piece(path, size)
            if pad := _padded(size) - size:
                yield pad, _constant(b"\0" * pad)
        yield len(END_OF_ARCHIVE), _constant(END_OF_ARCHIVE)

    def sha256(self) -> str:
        """The archive's SHA-256 (hex), reading all of it once."""
        digest = hashlib.sha256()
        for chunk in self.chunks():
            digest.update(chunk)
        return digest.hexdigest()


def _constant(data: bytes) -> _Piece:
    def piece(skip: int, n: int) -> Iterator[bytes]:
        yield data[skip : skip + n]

    return piece


def _file_piece(path: Path, size: int) -> _Piece:
    def piece(skip: int, n: int) -> Iterator[bytes]:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_size != size:
                raise OSError(f"{path} changed size while being sent")
            f.seek(skip)
            left = n
            while left:
                data = f.read(min(READ_BYTES, left))
                if not data:
                    raise OSError(f"{path} shrank while being sent")
                left -= len(data)
                yield data
            if skip + n == size and f.read(1):
                raise OSError(f"{path} grew while being sent")

    return piece


def checksum(archive: ModelTar, cache: Path) -> str:
    """The archive's SHA-256 (hex), kept in the file ``cache`` (JSON: the digest, the size and
    the listing it is of): read from there while the listing is the same, else computed and
    written (atomically, so two requests at once each leave a whole file)."""
    try:
        kept = json.loads(cache.read_text())
        if kept.get("listing") == archive.listing and kept.get("size") == archive.size:
            return str(kept["sha256"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # none yet, or unreadable: computed again
    digest = archive.sha256()
    record = {"sha256": digest, "size": archive.size, "listing": archive.listing}
    fd, tmp = tempfile.mkstemp(prefix=f".{cache.name}-", dir=cache.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, cache)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK
