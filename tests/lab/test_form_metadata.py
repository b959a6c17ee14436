"""The run form's labels, the runs list's symbols and the "advanced" flags come from the params'
Field metadata (the JSON schemas GET /api/presets serves), not from tables in the pages."""

from __future__ import annotations

from conspo.config import RunConfig
from conspo.objectives.base import PARAM_LABELS
from conspo.registry import get_objective, objective_names


def test_every_objective_labels_the_shared_parameters_once() -> None:
    for name in objective_names():
        props = get_objective(name).params.model_json_schema()["properties"]
        for param, (label, symbol) in PARAM_LABELS.items():
            if param in props:
                assert props[param]["title"] == label, (name, param)
                assert props[param].get("symbol", "") == symbol, (name, param)


def test_the_config_schema_carries_labels_symbols_and_advanced_flags() -> None:
    defs = RunConfig.model_json_schema()["$defs"]
    assert defs["SamplingConfig"]["properties"]["group_size"]["symbol"] == "G"
    assert defs["OptimConfig"]["properties"]["lr"]["title"] == "Learning rate"
    advanced = {
        f"{section}.{name}"
        for section, d in (("model", "ModelConfig"), ("sampling", "SamplingConfig"),
                           ("optim", "OptimConfig"))
        for name, p in defs[d]["properties"].items()
        if p.get("advanced")
    }  # fmt: skip
    assert {"model.dtype", "sampling.vllm_memory_fraction", "optim.micro_batch_tokens"} <= advanced
    assert "sampling.group_size" not in advanced
