"""A run whose reward calls a model (the ``reward_model`` reward): the model it names comes from
the same places as ``model.name``, refused at submit with a 422 at its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from backend.main import create_app
from tests.api.conftest import Api, tiny_config

LOC = ["body", "config", "rewards", 1, "params", "model"]


def with_reward_model(name: str) -> dict[str, Any]:
    rewards = [{"name": "verifier"}, {"name": "reward_model", "params": {"model": name}}]
    return tiny_config(2, rewards=rewards)


def test_a_reward_model_the_sources_refuse_is_a_422_at_its_field(api: Api, tmp_path: Path):
    rm = tmp_path / "my-rm"
    rm.mkdir()
    (rm / "config.json").write_text("{}")
    for name in ("/no/such/reward-model", str(rm), "Qwen/Qwen2.5-0.5B-Instruct"):
        r = api.post("/api/runs", json={"config": with_reward_model(name)})
        assert r.status_code == 422, r.text
        [found] = [d for d in r.json()["detail"] if d["loc"] == LOC]
        assert found["msg"].startswith(f"rewards[1].params.model {name!r} is not available here")
    # The same directory inside the operator's model roots is accepted.
    settings = api.settings.model_copy(update={"model_roots": [tmp_path]})
    with TestClient(create_app(settings)) as client:
        r = client.post(
            "/api/runs", json={"config": with_reward_model(str(rm))}, headers=api.h("alice")
        )
        assert r.status_code == 201, r.text
