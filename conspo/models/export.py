"""A checkpoint as a plain Hugging Face model directory, for serving or evaluation elsewhere.

    export_merged("out/checkpoints/step_000100", None, "exported")   # base from the checkpoint
    python -m conspo export out/checkpoints/step_000100 --out exported

A LoRA checkpoint's adapters are merged into its base model (peft's ``merge_and_unload``), in
float32, and saved in the base's own dtype; a full fine-tuning checkpoint already is such a
directory and is copied without its optimiser and trainer state. Either result loads with
``AutoModelForCausalLM.from_pretrained``.

``ModelTar`` streams such a directory as one tar archive (for a download), a block at a time:
its size is known before the first byte, and no more than a block is ever held in memory.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from conspo.models.lineage import ADAPTER_CONFIG, TRAINING_FILES


def recorded_base(checkpoint_dir: str | Path) -> str:
    """The base model a LoRA checkpoint's adapters were trained on, as the run loaded it."""
    config = json.loads((Path(checkpoint_dir) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{checkpoint_dir}/{ADAPTER_CONFIG} does not name its base model")
    return str(base)


def export_merged(
    checkpoint_dir: str | Path, base_model_path: str | Path | None, out_dir: str | Path
) -> Path:
    """Write ``checkpoint_dir`` as a plain model directory ``out_dir``; returns it.

    ``base_model_path``: a LoRA checkpoint's base (default: the one it records).
    """
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if not (checkpoint_dir / ADAPTER_CONFIG).exists():
        shutil.copytree(checkpoint_dir, out_dir, ignore=shutil.ignore_patterns(*TRAINING_FILES))
        return out_dir
    from peft import PeftModel

    base_path = base_model_path or recorded_base(checkpoint_dir)
    saved_dtype = AutoConfig.from_pretrained(base_path).dtype or torch.float32  # as shipped
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, checkpoint_dir).merge_and_unload()
    merged.to(saved_dtype).save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(checkpoint_dir).save_pretrained(out_dir)
    return out_dir


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
