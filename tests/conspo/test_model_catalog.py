"""The built-in model catalogue: one torch-free list that the store, the config and the API read."""

import os
import subprocess
import sys
from pathlib import Path

from conspo.config import ModelConfig, TaskConfig
from conspo.models.catalog import BUILTIN_MODELS

ROOT = Path(__file__).resolve().parents[2]


def test_every_recipe_is_buildable_from_the_catalogue():
    for name, model in BUILTIN_MODELS.items():
        assert model.name == name and model.description
        assert model.base is None or model.base in BUILTIN_MODELS
        assert bool(model.warm_start) == (model.base is not None) == (model.sft_steps > 0)
        for task in model.warm_start:
            TaskConfig.model_validate(task)


def test_model_name_help_lists_the_catalogue():
    description = ModelConfig.model_fields["name"].description or ""
    assert all(name in description for name in BUILTIN_MODELS)


def test_catalogue_config_and_tasks_load_without_torch():
    code = (
        "import sys; import conspo.models.catalog, conspo.config, conspo.registry;"
        " conspo.config.TaskConfig(name='countdown'); conspo.registry.task_names();"
        " assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch loaded'"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


def _merged(base: dict, over: dict) -> dict:
    """The form's merge (new_run.js withRecommended): sections merge key by key, but a section
    naming another registry entry (a task) replaces the one there with its parameters."""
    out = dict(base)
    for key, value in over.items():
        here = out.get(key)
        if isinstance(value, dict) and isinstance(here, dict):
            renamed = "name" in value and value["name"] != here.get("name")
            out[key] = value if renamed else _merged(here, value)
        else:
            out[key] = value
    return out


def test_a_models_recommended_settings_make_a_valid_run_over_the_forms_defaults():
    """What the form applies when a model is chosen (issue 37 item 6): over the demo's settings
    (the form's start), each recommendation is a run the config accepts, with its model."""
    from conspo.config import RunConfig
    from conspo.demo import DEMO_CONFIG

    smollm2 = BUILTIN_MODELS["smollm2-135m-instruct"]
    assert smollm2.recommended and smollm2.recommended_why
    for model in BUILTIN_MODELS.values():
        chosen = _merged(DEMO_CONFIG, {"model": {"name": model.name}})
        run = RunConfig.model_validate(_merged(chosen, model.recommended))
        assert run.model.name == model.name
    run = RunConfig.model_validate(_merged(DEMO_CONFIG, smollm2.recommended))
    # the demo's trap, undone: room to answer, LoRA, an answer format SmolLM2 writes
    assert run.sampling.max_new_tokens == 128 and run.model.lora.rank == 16
    assert run.task.params["answer_format"] == "last_number"
