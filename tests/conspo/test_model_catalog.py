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
