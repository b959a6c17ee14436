"""Every study file in examples/studies validates as a study (``StudyCreate``) and each of its
arms' configs as a RunConfig, as ``conspo-lab study run`` would submit it; the tuned one plans
what its header says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from backend.studies.spec import StudyCreate, validate_arm

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_study_validates(path: Path) -> None:
    study = StudyCreate.model_validate(yaml.safe_load(path.read_text()))
    for i, arm in enumerate(study.arms):
        config, errors = validate_arm(study.config, arm.overrides, ("arms", i))
        assert config is not None, errors
        for param, p in (arm.tune.space if arm.tune else {}).items():
            for value in (p.low, p.high):
                config, errors = validate_arm(study.config, {**arm.overrides, param: value}, ())
                assert config is not None, (arm.name, param, errors)


README = Path(__file__).resolve().parents[2] / "README.md"
README_STUDIES = [
    block
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    if "arms" in (yaml.safe_load(block) or {})
]


def test_the_readmes_study_blocks_validate_as_studies() -> None:
    """A study's arms, seeds and tuning seeds shown in the README, over a base config."""
    assert README_STUDIES, "the README shows a tuned study's arms"
    for block in README_STUDIES:
        study = StudyCreate.model_validate({"name": "readme", **yaml.safe_load(block)})
        for i, arm in enumerate(study.arms):
            config, errors = validate_arm(study.config, arm.overrides, ("arms", i))
            assert config is not None, errors


def test_the_tuned_smollm2_study_plans_what_it_says() -> None:
    """GRPO over lr, ConSPO over lr and τ, 4 trials each on 2 tuning seeds, then 5 final seeds:
    16 tuning runs and 10 final ones."""
    path = next(p for p in EXAMPLES if p.name == "smollm2_tuned.yaml")
    study = StudyCreate.model_validate(yaml.safe_load(path.read_text()))
    assert study.tuned and study.planned_runs() == (16, 10)
    assert not set(study.tuning_seeds) & set(study.seeds)
    spaces = {a.name: set(a.tune.space) for a in study.arms if a.tune}
    assert spaces == {"grpo": {"optim.lr"}, "conspo": {"optim.lr", "params.tau"}}
    assert all(a.tune and a.tune.space["optim.lr"].log for a in study.arms)
