"""Registry names are read from the registries, never typed by hand where they are shown
(issue 49): the API's schema and the Python client take a new registration without an edit."""

from __future__ import annotations

from typing import get_origin

import pytest

from backend.schemas import Presets as ServedPresets
from backend.schemas import RunOut
from conspo.registry import JOB_KINDS
from conspo_lab.client import Presets


def test_a_new_job_kind_is_named_in_the_api_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    builtin = JOB_KINDS.names()
    monkeypatch.setitem(JOB_KINDS._entries, "new_kind", JOB_KINDS.get("sft"))
    described = RunOut.model_json_schema()["properties"]["kind"]["description"]
    assert all(name in described for name in [*builtin, "new_kind"]), described


def test_the_client_types_every_registry_the_server_presents() -> None:
    """Each list of registered entries GET /api/presets serves is a typed field of the client's
    ``Presets`` (it had algorithms and tasks, not kinds nor rewards)."""
    served = {
        name
        for name, info in ServedPresets.model_fields.items()
        if get_origin(info.annotation) is list
    }
    assert served <= Presets.model_fields.keys()
