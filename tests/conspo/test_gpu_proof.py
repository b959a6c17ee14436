"""bench/gpu_proof.py on a CPU (--smoke): the checks it will run on a GPU, run here first on the
real SmolLM2 at toy sizes, so a GPU lease is never spent finding a bug a CPU could have found.

The correctness section runs here in full (the decode loop against the forward, the length
buckets' gradient against one padded forward, the memory estimate in three configs). Its speed,
Qwen and learning sections are the existing bench scripts (throughput.py, gpu_step.py,
gpu_real_model.py) with flags; their smoke runs take ~6 minutes of this CPU together and are left
to `bench/gpu_proof.py --smoke` by hand (bench/README.md), not CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import shared_model_store

ROOT = Path(__file__).resolve().parents[2]


def proof(tmp_path: Path, store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CONSPO_MODEL_STORE": str(store),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    return subprocess.run(
        [sys.executable, "bench/gpu_proof.py", "--smoke", "--out", str(tmp_path), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip


@pytest.mark.slow
def test_the_correctness_checks_pass_on_the_real_model_on_a_cpu(tmp_path, tmp_path_factory):
    out = proof(tmp_path, shared_model_store(tmp_path_factory), "--sections", "correctness")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    table = (tmp_path / "gpu_proof.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| correctness")]
    # decode (float32, bfloat16), buckets (float32), the sampler mismatch (float32,
    # bfloat16), asynchronous generation, one memory config on a CPU, the environment
    # rollout, the reward-model reward's scorer, system
    assert len(rows) == 10, table
    (
        decode,
        decode_bf16,
        buckets,
        mismatch,
        mismatch_bf16,
        overlapped,
        *memory,
        played,
        scored,
        nvml,
    ) = rows
    assert "asynchronous generation, k = 1" in overlapped and overlapped.endswith("| ok |")
    assert "lags [0, 1, 1]" in overlapped and "step 1 loss = sync" in overlapped
    assert "sampler vs trainer log-probs" in mismatch and mismatch.endswith("| ok |")
    assert "sequence_mask (C 3) leaves out" in mismatch_bf16 and "bfloat16" in mismatch_bf16
    assert "environment rollout" in played and played.endswith("| ok |")
    assert "written tokens are the replay's argmax" in played
    assert "reward-model reward" in scored and scored.endswith("| ok |")
    assert "max /batched − alone/" in scored  # padded batches score each text as it alone
    assert "none on a CPU (a CPU run" in nvml and nvml.endswith("| ok |")
    assert "decode loop vs forward" in decode and decode.endswith("| ok |")
    assert "argmax agrees 8/8" in decode  # two rows of four tokens, all agreeing
    # bfloat16: both paths against the float32 model, the loop no further off than the forward
    assert "in bfloat16 vs float32" in decode_bf16 and decode_bf16.endswith("| ok |")
    assert "loop: max /Δ log p/" in decode_bf16 and "bfloat16 forward:" in decode_bf16
    assert "bucketed vs one padded forward" in buckets and buckets.endswith("| ok |")
    assert "1 bucket" not in buckets  # the split was exercised
    for row in memory:
        assert "estimate" in row and "ratio" in row and "not judged on a CPU" in row
    assert "DEVIATION" not in table


def test_a_deviation_fails_the_run_and_still_prints_the_table(tmp_path, tmp_path_factory):
    """A bound nothing can meet (monkeypatched through -c): the check is a DEVIATION, the exit
    status 1, and the table is written all the same."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'bench'}", "OMP_NUM_THREADS": "1",
           "CONSPO_MODEL_STORE": str(shared_model_store(tmp_path_factory)),
           "HF_HUB_OFFLINE": "1"}  # fmt: skip
    argv = ["gpu_proof.py", "--smoke", "--sections", "correctness", "--out", str(tmp_path)]
    code = (
        "import sys, gpu_proof; gpu_proof.DECODE_BOUND['float32'] = -1.0;"
        "gpu_proof.memory_check = lambda proof: None;"  # the memory children: not this test's
        "gpu_proof.bucket_check = lambda proof, dtype: None;"
        "gpu_proof.async_check = lambda proof: None;"
        f"sys.argv = {argv!r};"
        "gpu_proof.main()"
    )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    table = (tmp_path / "gpu_proof.md").read_text()
    assert "| DEVIATION |" in table and "decode loop vs forward" in table


def test_an_unknown_section_is_named():
    out = subprocess.run(
        [sys.executable, "bench/gpu_proof.py", "--smoke", "--sections", "correctness,warp"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode != 0
    assert "unknown warp" in out.stderr
