"""GPU-node features over HTTP: configs needing packages that no live worker has are refused at
submit (422 at the field), workers advertise their GPUs and packages in /api/health, a run
records the device and dtype it trained in, and a run out of GPU memory fails with what to
change. Both databases."""

from __future__ import annotations

import importlib.util
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from alembic import command
from sqlalchemy import inspect, text

from backend import liveness
from backend.config import Settings
from backend.db import Database, make_engine
from backend.liveness import WorkerIdentity
from backend.migrate import alembic_config, migrate
from backend.models import Run, Worker, utcnow
from conspo.generation.vllm_interpreter import vllm_available
from conspo.sandbox import sandbox_available
from tests.api.conftest import (
    Api,
    create_pg_database,
    drop_pg_database,
    run_in_worker,
    tiny_config,
)

pytestmark = pytest.mark.services

VLLM = {"sampling": {**tiny_config(1)["sampling"], "engine": "vllm"}}
FLASH = {"model": {"name": "tiny", "attn_implementation": "flash_attention_2"}}
H200 = [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 150_000_000_000}]
GPU_NODE = {"engines": ["native", "hf", "vllm"], "flash_attn": True, "torch": "2.13", "cuda": "13"}
CPU_NODE = {"engines": ["native", "hf"], "flash_attn": False, "torch": "2.13", "cuda": None}

needs_missing_packages = pytest.mark.skipif(
    vllm_available() or importlib.util.find_spec("flash_attn") is not None,
    reason="the API process itself has vllm or flash_attn",
)


def alive(settings: Settings, me: WorkerIdentity, seen_ago_s: float = 0) -> None:
    db = Database(settings)
    with db.session() as session:
        liveness.mark_alive(session, me)
        if seen_ago_s:
            row = session.get(Worker, me.name)
            assert row is not None
            row.seen_at = utcnow() - timedelta(seconds=seen_ago_s)
            session.commit()
    db.dispose()


def errors_at(response: Any) -> dict[tuple[str | int, ...], str]:
    assert response.status_code == 422, response.text
    return {tuple(e["loc"]): e["msg"] for e in response.json()["detail"]}


@needs_missing_packages
def test_vllm_and_flash_attention_without_them_are_refused_at_the_field(own_api: Api) -> None:
    r = own_api.post("/api/runs", json={"config": tiny_config(1, **VLLM, **FLASH)})
    errors = errors_at(r)
    engine = errors[("body", "config", "sampling", "engine")]
    attn = errors[("body", "config", "model", "attn_implementation")]
    assert "needs the vllm package" in engine and "native or hf" in engine
    assert "needs the flash_attn package" in attn and "sdpa" in attn
    # A clone asking for vllm is refused the same way, under overrides.
    run_id = own_api.post("/api/runs", json={"config": tiny_config(1)}).json()["runs"][0]["id"]
    clone = own_api.post(f"/api/runs/{run_id}/clone", json={"overrides": VLLM})
    assert "needs the vllm package" in errors_at(clone)[("body", "overrides", "sampling", "engine")]


@needs_missing_packages
def test_a_live_gpu_worker_that_has_them_makes_them_acceptable(own_api: Api) -> None:
    settings = own_api.settings
    config = tiny_config(1, **VLLM, **FLASH)
    # A CPU worker, and a GPU worker that stopped renewing its row: neither counts.
    alive(settings, WorkerIdentity(host="cpu-1", pid=1, capabilities=CPU_NODE))
    gone = WorkerIdentity(host="gpu-0", pid=2, gpus=H200, capabilities=GPU_NODE)
    alive(settings, gone, seen_ago_s=settings.worker_alive_s + 5)
    assert set(errors_at(own_api.post("/api/runs", json={"config": config}))) == {
        ("body", "config", "sampling", "engine"),
        ("body", "config", "model", "attn_implementation"),
    }
    alive(settings, WorkerIdentity(host="gpu-1", pid=3, gpus=H200, capabilities=GPU_NODE))
    r = own_api.post("/api/runs", json={"config": config})
    assert r.status_code == 201, r.text
    workers = {w["name"]: w for w in own_api.get("/api/health").json()["workers"]}
    assert set(workers) == {"cpu-1:1", "gpu-1:3"}
    assert workers["gpu-1:3"]["gpus"] == H200 and workers["gpu-1:3"]["capabilities"] == GPU_NODE
    assert workers["cpu-1:1"]["gpus"] == [] and workers["cpu-1:1"]["capabilities"] == CPU_NODE


def test_the_worker_probe_describes_this_machine() -> None:
    from worker.capabilities import probe

    gpus, caps = probe()
    assert caps["torch"] == torch.__version__
    assert {"native", "hf"} <= set(caps["engines"])
    assert ("vllm" in caps["engines"]) == vllm_available()
    assert len(gpus) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if not gpus:
        assert caps["cuda"] is None and caps["flash_attn"] is False
    assert caps["sandbox"] == ("bwrap" if sandbox_available() else "none")


def test_a_run_records_the_device_and_dtype_it_trained_in(own_api: Api) -> None:
    run = run_in_worker(own_api, tiny_config(1))
    assert run["status"] == "succeeded", run["error"]
    want = ("cuda:0", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")
    assert run["device"].startswith(want[0]) and run["dtype"] == want[1]


def test_a_run_out_of_gpu_memory_fails_with_what_to_change(
    own_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated: no GPU here, so the step's update raises torch.OutOfMemoryError (what PyTorch
    raises when a CUDA allocation fails) instead of a real allocation failing."""
    import conspo.training.trainer

    def out_of_memory(*_: Any) -> None:
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 139.8 GiB total capacity)"
        )

    monkeypatch.setattr(conspo.training.trainer, "update", out_of_memory)
    run = run_in_worker(own_api, tiny_config(2))
    assert run["status"] == "failed"
    first_line, rest = run["error"].split("\n", 1)
    assert first_line.startswith("out of device memory (CUDA out of memory. Tried to allocate")
    # The allocator's words, the estimate, and each setting that lowers it with its value now.
    assert "needs about" in first_line and "optim.micro_batch_tokens (now 0" in first_line
    assert "model.gradient_checkpointing (now false)" in first_line
    assert "Traceback (most recent call last)" in rest and "OutOfMemoryError" in rest
    db = Database(own_api.settings)
    with db.session() as session:
        row = session.get(Run, run["id"])
        assert row is not None and row.attempt == 1 and row.worker_deaths == 0
    db.dispose()


def test_the_memory_estimate_follows_the_config_and_agrees_with_submit(api: Api) -> None:
    def report(config: dict[str, Any]) -> dict[str, Any]:
        r = api.post("/api/runs/estimate", json={"config": config, "seeds": [0], "tags": []})
        assert r.status_code == 200, r.text
        return r.json()

    small = report(tiny_config(1))
    assert small["fits"] is True and small["total_bytes"] > 0
    assert small["total_bytes"] == small["parts"]["process"] + small["parts"]["state"] + max(
        small["parts"][k] for k in ("sampling", "evaluation", "update")
    )
    assert small["text"].startswith("needs about")
    bigger = report(tiny_config(1, sampling={**tiny_config(1)["sampling"], "group_size": 64}))
    assert bigger["parts"]["sampling"] > small["parts"]["sampling"]
    assert bigger["parts"]["state"] == small["parts"]["state"]
    huge_sampling = {"prompts_per_step": 4096, "group_size": 256, "max_new_tokens": 32_768}
    huge = tiny_config(1, sampling=huge_sampling)
    refused = report(huge)
    assert refused["fits"] is False and refused["total_bytes"] > refused["limit_bytes"]
    assert "lower sampling.prompts_per_step" in refused["text"]
    submitted = api.post("/api/runs", json={"config": huge})
    assert any(e["loc"][:3] == ["body", "config", "sampling"] for e in errors_of(submitted))
    # A memory budget no split of the gradient pass can meet is refused at its field.
    starved = tiny_config(1, optim={"memory_budget": 0.001})
    assert report(starved)["fits"] is False
    assert "optim.memory_budget" in report(starved)["text"]
    submitted = api.post("/api/runs", json={"config": starved})
    assert any(e["loc"] == ["body", "config", "optim", "memory_budget"]
               for e in errors_of(submitted))  # fmt: skip
    assert small["micro_batch_tokens"] == 0  # a small step needs no split
    unknown = report(tiny_config(1, model={"name": "no/such-model"}))
    assert unknown["total_bytes"] is None and unknown["fits"] is None and unknown["text"]
    invalid = report({"sampling": {"group_size": 1}})  # a form half filled in: no 422
    assert invalid["total_bytes"] is None and invalid["fits"] is None
    assert "sampling.group_size" in invalid["text"]


def test_the_estimate_and_the_run_say_when_this_cpu_has_no_native_bfloat16(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU without AVX512-BF16 or AMX, a bfloat16 config on the CPU is flagged by the
    form's estimate and by the device a worker records (the run page shows it); float32 is
    not, and nor is bfloat16 where the CPU has it natively."""
    from conspo.config import RunConfig
    from conspo.models import precision
    from worker.tasks import device_and_dtype

    bf16 = tiny_config(1, model={"name": "tiny", "device": "cpu", "dtype": "bfloat16"})
    fp32 = tiny_config(1, model={"name": "tiny", "device": "cpu", "dtype": "float32"})

    def text(config: dict[str, Any]) -> str:
        r = api.post("/api/runs/estimate", json={"config": config, "seeds": [0], "tags": []})
        assert r.status_code == 200, r.text
        return r.json()["text"]

    for flags, flagged in (("", True), ("avx512_bf16", False)):
        monkeypatch.setattr(precision, "cpu_bfloat16", lambda flags=flags: flags)
        assert ("no native bfloat16" in text(bf16)) is flagged
        assert "no native bfloat16" not in text(fp32)
        device, dtype = device_and_dtype(RunConfig.model_validate(bf16))
        assert dtype == "bfloat16" and ("no native bfloat16" in device) is flagged
        assert device_and_dtype(RunConfig.model_validate(fp32)) == ("cpu", "float32")
        assert len(device) <= Run.device.type.length  # type: ignore[attr-defined]


def errors_of(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    return list(response.json()["detail"])


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_0005_existing_workers_advertise_nothing_and_runs_have_no_dtype(
    dialect: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'm.db'}" if dialect == "sqlite" else create_pg_database()
    engine = make_engine(url)
    try:
        migrate(url, "0004")
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO workers VALUES ('h:1', 'h', 1, :now, :now)"),
                {"now": datetime.now(UTC)},
            )
        migrate(url, "head")
        with engine.connect() as conn:
            row = conn.execute(text("SELECT gpus, capabilities FROM workers")).one()
            runs = {c["name"] for c in inspect(conn).get_columns("runs")}
        assert [json.loads(v) if isinstance(v, str) else v for v in row] == [[], {}]
        assert "dtype" in runs
        command.downgrade(alembic_config(url), "0004")
        with engine.connect() as conn:
            assert "gpus" not in {c["name"] for c in inspect(conn).get_columns("workers")}
            assert conn.execute(text("SELECT count(*) FROM workers")).scalar_one() == 1
    finally:
        engine.dispose()
        if dialect == "postgresql":
            drop_pg_database(url)
