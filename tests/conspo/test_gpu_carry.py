"""bench/gpu_carry.py: the GGUF cut so every device call fits, put back together only when its
sha256 matches, and the carried wheels pinned as pyproject.toml pins them."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_carry  # noqa: E402  # bench/ is not a package

MIB = 2**20


def test_parts_fit_every_call_and_add_up_to_the_file():
    total, wheels, call = int(93.8 * MIB), int(28.6 * MIB), int(54 * MIB)
    sizes = gpu_carry.plan_parts(total, wheels, call)
    assert sum(sizes) == total
    assert sizes[0] + wheels <= call and all(s <= call for s in sizes)
    assert len(sizes) == 3  # 25.4 + 54 + 14.4 MiB
    assert gpu_carry.plan_parts(10, 0, 100) == [10]
    with pytest.raises(ValueError, match="leave no room"):
        gpu_carry.plan_parts(total, call, call)


def write_parts(folder: Path, data: bytes, sizes: list[int]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for k, size in enumerate(sizes, start=1):
        (folder / f"gguf.part{k}").write_bytes(data[start : start + size])
        start += size
    manifest = {"sha256": hashlib.sha256(data).hexdigest(), "parts": len(sizes)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_the_parts_are_put_back_together_and_checked(tmp_path):
    data = bytes(range(256)) * 1000
    write_parts(tmp_path / "stash", data, [100_000, 100_000, 56_000])
    target = tmp_path / "site" / "pkg" / "model.gguf"
    gpu_carry.assemble(tmp_path / "stash", target)
    assert target.read_bytes() == data


def test_a_damaged_or_missing_part_is_named_and_leaves_no_file(tmp_path):
    data = bytes(range(256)) * 1000
    write_parts(tmp_path / "stash", data, [100_000, 156_000])
    part = tmp_path / "stash" / "gguf.part2"
    part.write_bytes(part.read_bytes()[:-1] + b"\x00")
    target = tmp_path / "site" / "model.gguf"
    with pytest.raises(SystemExit, match="sha256 .* is not the manifest's"):
        gpu_carry.assemble(tmp_path / "stash", target)
    assert not target.exists()
    part.unlink()
    with pytest.raises(SystemExit, match="missing gguf.part2"):
        gpu_carry.assemble(tmp_path / "stash", target)


def test_carried_wheels_are_pinned_as_the_project_pins_them():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for spec in project["dependencies"] + [d for ds in project["optional-dependencies"].values()
                                           for d in ds]:  # fmt: skip
        if m := re.fullmatch(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^;\s]+)", spec.strip()):
            pins[m[1].lower().replace("_", "-")] = m[2]
    carried = [w.split("==") for w in gpu_carry.WHEELS + gpu_carry.SOURCE_ONLY]
    checked = 0
    for name, version in carried:
        key = name.lower().replace("_", "-")
        if key in pins:
            assert pins[key] == version, f"{name}: carried {version}, pyproject pins {pins[key]}"
            checked += 1
    # transformers, peft, trl, datasets, pydantic, regex, gguf, reasoning-gym, math-verify
    assert checked >= 9
