"""Tests for jaxrl_reason.data.templates: named and custom prompt templates."""
import pytest

from jaxrl_reason.data import templates
from jaxrl_reason.data.templates import TEMPLATES, Template, apply_template, get_template

EXAMPLE = {"id": "m-1", "prompt": "What is $1+1$?", "answer": "2", "type": "Algebra"}


def test_plain_keeps_the_problem():
    out = apply_template(EXAMPLE, "plain")
    assert out["prompt"] == EXAMPLE["prompt"] and out["problem"] == EXAMPLE["prompt"]


def test_r1_instruction():
    out = apply_template(EXAMPLE, "r1")
    text = out["prompt"]
    assert text.startswith("A conversation between User and Assistant.")
    assert "<think> </think> and <answer> </answer> tags" in text
    assert text.endswith("User: What is $1+1$?\nAssistant:")
    assert out["problem"] == "What is $1+1$?"


def test_boxed_instruction():
    out = apply_template(EXAMPLE, "boxed")
    assert out["prompt"] == (
        "What is $1+1$?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )


def test_apply_returns_a_copy_and_keeps_other_fields():
    example = dict(EXAMPLE)
    out = apply_template(example, "boxed")
    assert example == EXAMPLE  # input untouched
    assert {k: out[k] for k in ("id", "answer", "type")} == {"id": "m-1", "answer": "2",
                                                             "type": "Algebra"}


def test_custom_template_with_other_fields_and_literal_braces():
    tpl = get_template("[{type}] {prompt} Answer in \\boxed{{}}. ({prompt})")
    assert tpl.name == "custom" and tpl.fields == ("type", "prompt")
    out = apply_template(EXAMPLE, tpl)
    assert out["prompt"] == "[Algebra] What is $1+1$? Answer in \\boxed{}. (What is $1+1$?)"


def test_every_named_template_is_valid():
    for name in TEMPLATES:
        tpl = get_template(name)
        assert tpl == Template(name, TEMPLATES[name], ("prompt",))
        assert "{prompt}" not in tpl.render({"prompt": "P"})


@pytest.mark.parametrize(
    "text, message",
    [
        ("r2", r"unknown template 'r2': use one of \['boxed', 'plain', 'r1'\]"),
        ("Solve: {question}", r"template 'custom' has no \{prompt\} field"),
        ("Q: {} ", r"template 'custom' has field '\{\}'"),
        ("Q: {0} {prompt}", r"template 'custom' has field '\{0\}'"),
        ("Q: {prompt.upper}", r"template 'custom' has field '\{prompt.upper\}'"),
        ("Q: {prompt[0]}", r"template 'custom' has field"),
        ("Q: {prompt!r}", "conversion or format spec"),
        ("Q: {prompt:>10}", "conversion or format spec"),
        ("Q: {prompt", "not a valid format string"),
        ("Q: {prompt} \\boxed{}", r"has field '\{\}'.*literal braces"),
    ],
)
def test_template_errors(text, message):
    with pytest.raises(ValueError, match=message):
        get_template(text)


def test_missing_example_field_names_template_and_field():
    with pytest.raises(ValueError, match=r"template 'custom' uses field 'level'"):
        apply_template(EXAMPLE, "Level {level}: {prompt}")
    with pytest.raises(ValueError, match=r"template 'plain' uses field 'prompt'"):
        apply_template({"question": "q"}, "plain")
    with pytest.raises(TypeError):
        get_template(3)


def test_register_template(monkeypatch):
    monkeypatch.setattr(templates, "TEMPLATES", dict(TEMPLATES))
    templates.register_template("qa", "Question: {prompt}\nAnswer:")
    assert apply_template(EXAMPLE, "qa")["prompt"] == "Question: What is $1+1$?\nAnswer:"
    with pytest.raises(ValueError, match="already registered"):
        templates.register_template("qa", "{prompt}")
    with pytest.raises(ValueError, match=r"no \{prompt\} field"):
        templates.register_template("bad", "Question:")
