"""docker-compose.yml, .env.example and the Dockerfile, checked as files.

No Docker engine runs here (nor in CI): these tests parse the compose file with PyYAML and check
its structure, and that every CONSPO_* variable it or .env.example sets is a field of
``backend.config.Settings``, so a renamed setting cannot silently leave the cluster on defaults.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def settings_env_names() -> set[str]:
    from backend.config import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    assert prefix == "CONSPO_"
    return {(prefix + name).upper() for name in Settings.model_fields}


def env_example() -> dict[str, str]:
    """Assignments of .env.example, including commented-out ``# NAME=value`` examples."""
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = re.match(r"^\s*#?\s*([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?msg}, $$ (nested defaults ok)."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("${", i):
            depth, j = 1, i + 2
            while depth:
                if value.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                depth -= value[j] == "}"
                j += 1
            body = value[i + 2 : j - 1]
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])(.*))?$", body, re.S)
            assert m, f"cannot parse ${{{body}}}"
            name, op, rest = m.groups()
            current = env.get(name)
            if op in (":-", "-") and (current is None or (op == ":-" and current == "")):
                current = interpolate(rest, env)
            if op in (":?", "?") and not current:
                raise AssertionError(f"{name} is required: {rest}")
            out.append(current or "")
            i = j
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def service_env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def test_interpolate_handles_nested_defaults():
    env = {"A": "x"}
    assert interpolate("${A:-no}/${B:-${A}-y}/$${C}", env) == "x/x-y/${C}"


def test_services_exist_with_healthchecks(compose):
    services = compose["services"]
    assert {"postgres", "redis", "api", "worker", "flower"} <= set(services)
    for name in ("postgres", "redis", "api"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]


def test_api_migrates_then_serves_after_healthy_services(compose):
    api = compose["services"]["api"]
    command = " ".join(api["command"]) if isinstance(api["command"], list) else api["command"]
    assert command.index("conspo-lab migrate") < command.index("conspo-lab serve")
    for dep in ("postgres", "redis"):
        assert api["depends_on"][dep]["condition"] == "service_healthy"


def test_worker_reserves_nvidia_gpus_and_can_scale(compose):
    worker = compose["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    # --scale worker=N needs no fixed name and no fixed host port.
    assert "container_name" not in worker and "ports" not in worker
    script = worker["command"] if isinstance(worker["command"], str) else worker["command"][-1]
    assert "conspo-lab worker" in script and "CUDA_VISIBLE_DEVICES" in script
    assert interpolate(service_env(worker)["CONSPO_QUEUE"], env_example()) == "gpu"


def test_every_conspo_variable_is_a_settings_field(compose, settings_env_names):
    text = COMPOSE.read_text()
    used = set(re.findall(r"\b(CONSPO_[A-Z0-9_]+)", text))
    used |= {name for name in env_example() if name.startswith("CONSPO_")}
    for service in compose["services"].values():
        used |= {k for k in service_env(service) if k.startswith("CONSPO_")}
    unknown = sorted(used - settings_env_names)
    assert not unknown, f"not fields of backend.config.Settings: {unknown}"
    assert {"CONSPO_DATABASE_URL", "CONSPO_BROKER_URL"} <= used


def test_cluster_settings_resolve_to_postgres_and_redis(compose):
    from backend.config import Settings

    env_file = {k: v for k, v in env_example().items() if not k.startswith("CONSPO_")}
    for name in ("api", "worker"):
        env = {
            k: interpolate(v, env_file) for k, v in service_env(compose["services"][name]).items()
        }
        assert env["CONSPO_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in env["CONSPO_DATABASE_URL"]
        assert env["CONSPO_BROKER_URL"] == "redis://redis:6379/0"
        fields = {k.removeprefix("CONSPO_").lower(): v for k, v in env.items() if v}
        settings = Settings(**{k: v for k, v in fields.items() if k in Settings.model_fields})
        assert settings.mode == "cluster"
    flower = compose["services"]["flower"]
    assert interpolate(service_env(flower)["CELERY_BROKER_URL"], env_file) == "redis://redis:6379/0"


def test_dockerfile_pins_torch_before_the_project():
    text = DOCKERFILE.read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("FROM")] == ["FROM python:3.11-slim"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    pinned = re.search(r'"torch==([^"]+)"', pyproject).group(1)
    assert f"ARG TORCH_VERSION={pinned}" in text
    assert text.index("torch==${TORCH_VERSION}") < text.index("pip install --no-deps -e .")


@pytest.mark.parametrize(("code", "healthy"), [(200, True), (503, False)])
def test_api_healthcheck_fails_when_health_answers_503(compose, code: int, healthy: bool):
    """/api/health is 503 when the database or broker is down: the container turns unhealthy."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        test = compose["services"]["api"]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "python"]
        here = f"http://127.0.0.1:{server.server_port}"
        argv = [sys.executable, *(a.replace("http://127.0.0.1:8000", here) for a in test[2:])]
        assert (subprocess.run(argv, capture_output=True, timeout=60).returncode == 0) is healthy
    finally:
        server.shutdown()


def test_workers_load_no_hub_model_and_stay_offline_unless_the_operator_says(compose):
    """No download by default (class 8 of issue 9): HF_HUB_OFFLINE=1 and an empty allowlist,
    with or without the .env.example; the API checks inputs with the same settings and mounts."""
    from backend.config import Settings

    services = compose["services"]
    for env_file in ({}, env_example()):
        env = {
            name: {k: interpolate(v, env_file) for k, v in service_env(services[name]).items()}
            for name in ("api", "worker")
        }
        for key in ("CONSPO_DATA_ROOTS", "CONSPO_MODEL_ROOTS", "CONSPO_HUB_ALLOW"):
            assert env["api"][key] == env["worker"][key], key
        worker = env["worker"]
        assert worker["HF_HUB_OFFLINE"] == "1" and worker["CONSPO_HUB_ALLOW"] == ""
        fields = {k.removeprefix("CONSPO_").lower(): v for k, v in worker.items()}
        settings = Settings(**{k: v for k, v in fields.items() if k in Settings.model_fields})
        assert settings.hub_allow == [] and settings.model_roots == [Path("/models")]
        assert settings.data_roots == [Path("/data/datasets")]
        assert settings.max_run_memory_gib > 0
    for name in ("api", "worker"):
        mounts = [interpolate(v, {}).split(":")[1] for v in services[name]["volumes"]]
        assert "/models" in mounts and "/data" in mounts, name


def test_an_8_gpu_node_and_an_optional_ray_cluster(compose):
    """The 8-GPU worker reserves 8 GPUs and sets the settings scheduling reads; the Ray head and
    worker come only with profile ray, built with the ray extra the multi-node path imports."""
    services = compose["services"]
    node8 = services["worker-node8"]
    devices = node8["deploy"]["resources"]["reservations"]["devices"]
    assert [(d["driver"], d["count"]) for d in devices] == [("nvidia", 8)]
    env = service_env(node8)
    assert interpolate(env["CONSPO_QUEUE"], env_example()) == "gpu"  # gpu, gpu-2 … gpu-8
    assert {"CONSPO_WORKER_CPU_PROCESSES", "CONSPO_RAY_ADDRESS"} <= set(env)
    assert "conspo-lab worker" in " ".join(node8["command"])
    assert services["ray-head"]["profiles"] == ["ray"] == services["ray-worker"]["profiles"]
    assert "--head" in services["ray-head"]["command"]
    assert services["ray-worker"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] == 8
    for name in ("worker-node8", "ray-head", "ray-worker"):
        assert services[name]["build"]["args"]["LAB_EXTRAS"] == "ray"
        assert "labdata:/data" in services[name]["volumes"]  # the run workdirs, shared
    assert "LAB_EXTRAS" in DOCKERFILE.read_text()
    # Plain `docker compose up` starts neither (they would compete with `worker` for GPUs).
    assert "profiles" not in services["worker"] and node8["profiles"] == ["node8"]
