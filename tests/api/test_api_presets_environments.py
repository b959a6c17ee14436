"""GET /api/presets lists the environments the task ``environment`` may play: the run form
offers them as a select for ``task.params.environment`` (a name typed wrong was refused only at
Start), each with the schema and defaults of its ``task.params.environment_params``."""

from __future__ import annotations

from conspo.registry import environment_names, get_environment
from tests.api.conftest import Api


def test_presets_list_the_registered_environments_with_their_params(api: Api) -> None:
    environments = {e["name"]: e for e in api.get("/api/presets").json()["environments"]}
    assert list(environments) == environment_names()
    assert {"guess_number", "ta_guess_the_number", "trl", "gym"} <= set(environments)
    for name, preset in environments.items():
        registered = get_environment(name)
        assert preset["description"] == registered.description
        assert preset["params_schema"] == registered.params.model_json_schema()
        required = set(preset["params_schema"].get("required", []))
        assert set(preset["defaults"]) == set(registered.params.model_fields) - required
    assert "entry_point" not in environments["gym"]["defaults"]  # the user's to give
    assert environments["ta_guess_the_number"]["defaults"] == {"variant": "GuessTheNumber-v0"}
