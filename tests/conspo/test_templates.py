"""conspo.templates: ``{field}`` placeholders and doubled braces, nothing else, bounded output."""

from __future__ import annotations

import pytest

from conspo.config import PROMPT_TEMPLATES, PromptConfig
from conspo.templates import TemplateTooLarge, placeholders, render, template_problem

FIELDS = ("question",)


@pytest.mark.parametrize(
    "template", [*PROMPT_TEMPLATES.values(), "{{x}} {question} {{}}", "a}}{{b"]
)
def test_renders_as_str_format_does_on_the_templates_it_accepts(template: str) -> None:
    assert template_problem(template, FIELDS) is None
    assert render(template, {"question": "2+3?"}) == template.format(question="2+3?")


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ("{question:>1000000000}{question}", "'{question:>1000000000}' at character 0"),
        ("x {question.__class__}", "'{question.__class__}' at character 2"),
        ("{question[x]}", "'{question[x]}' at character 0"),
        ("{question!r}", "'{question!r}'"),
        ("{}{question}", "'{}' at character 0"),
        ("{0}{question}", "'{0}'"),
        ("{other}{question}", "'{other}'"),
        ("{question}}", "a lone '}' at character 10"),
        ("{ {question}", "a lone '{' at character 0"),
    ],
)
def test_anything_but_a_listed_field_is_refused_with_its_position(
    template: str, named: str
) -> None:
    problem = template_problem(template, FIELDS)
    assert problem is not None and named in problem
    with pytest.raises(ValueError, match="template"):
        PromptConfig(template=template)


def test_the_output_size_is_checked_before_anything_is_built() -> None:
    template = "{question}" * 400
    with pytest.raises(TemplateTooLarge, match="400,000,400 characters"):
        render(template, {"question": "x" * 1_000_001})
    assert len(render(template, {"question": "xy"}, max_chars=800)) == 800
    assert placeholders("{question} and {question}", FIELDS) == ["question", "question"]
