"""A model directory as one tar archive, streamed (a download of an exported model): its size
is known before the first byte, and no more than one read block is ever held in memory.

Standard library only: the web app serves downloads without importing torch or transformers.
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from pathlib import Path

BLOCK = tarfile.BLOCKSIZE  # 512: every member's data is padded to a whole number of these
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
READ_BYTES = 1 << 20


class ModelTar:
    """The directory ``root`` as an uncompressed tar (weights hardly compress) whose members
    sit under ``top/``: ``tar -xf`` it and ``from_pretrained("top")`` loads.

        archive = ModelTar(Path("exports/run-7-last"), "run-7-last")
        archive.size                       # bytes, for Content-Length
        for chunk in archive.chunks(): ... # headers and file contents, in order
    """

    def __init__(self, root: Path, top: str) -> None:
        self.members: list[tuple[tarfile.TarInfo, Path]] = []
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
            self.members.append((info, path))
        self.size = len(END_OF_ARCHIVE) + sum(
            len(self._header(info)) + _padded(info.size) for info, _ in self.members
        )

    @staticmethod
    def _header(info: tarfile.TarInfo) -> bytes:
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")

    def chunks(self) -> Iterator[bytes]:
        """The archive's bytes, ``self.size`` of them; a file whose size changed since the
        listing raises (its header would lie about it)."""
        for info, path in self.members:
            yield self._header(info)
            if not info.isfile():
                continue
            left = info.size
            with path.open("rb") as f:
                while left:
                    data = f.read(min(READ_BYTES, left))
                    if not data:
                        raise OSError(f"{path} shrank while being sent")
                    left -= len(data)
                    yield data
                if f.read(1):
                    raise OSError(f"{path} grew while being sent")
            if pad := _padded(info.size) - info.size:
                yield b"\0" * pad
        yield END_OF_ARCHIVE


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK
