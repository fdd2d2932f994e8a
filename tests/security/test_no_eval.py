"""No reward module evaluates a string: an AST scan over `jaxrl_reason/rewards/`.

Untrusted text (model output, dataset answers, user files) must only ever be parsed into a
tree; these calls would evaluate it. The code sandbox's child program is a string run inside
the OS sandbox: `_code_harness.py`, whose whole purpose is to run the answer (and the calls
of converted assert tests) inside bubblewrap, is the one file exempt, and it may only use
`compile`, `exec` and `eval`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REWARDS = Path(__file__).resolve().parents[2] / "jaxrl_reason" / "rewards"
FORBIDDEN = {"eval", "exec", "compile", "sympify", "parse_expr", "eval_expr", "S",
             "parse_latex", "__import__", "execfile", "runcode", "lambdify"}


def forbidden_calls(source: str, filename: str) -> list[str]:
    """`name (file:line)` of every call of a FORBIDDEN name or attribute in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                name = f.id
            elif isinstance(f, ast.Attribute) and f.attr != "compile":  # re.compile is fine
                name = f.attr
            else:
                continue
            if name in FORBIDDEN:
                found.append(f"{name} ({filename}:{node.lineno})")
    return found


def test_scanner_finds_what_it_looks_for():
    src = ("import sympy\nx = sympy.sympify(s)\neval(t)\nfrom sympy import S\ny = S('1')\n"
           "z = re.compile('a')\nc = compile(s, 'f', 'exec')\n")
    assert forbidden_calls(src, "m.py") == [
        "sympify (m.py:2)", "eval (m.py:3)", "S (m.py:5)", "compile (m.py:7)"]


SANDBOX_PROGRAM = "_code_harness.py"


@pytest.mark.parametrize("path", sorted(p for p in REWARDS.glob("*.py") if p.name != SANDBOX_PROGRAM),
                         ids=lambda p: p.name)
def test_no_string_evaluation_in_rewards(path):
    assert forbidden_calls(path.read_text(encoding="utf-8"), path.name) == []


def test_sandbox_program_only_runs_the_answer():
    found = forbidden_calls((REWARDS / SANDBOX_PROGRAM).read_text(encoding="utf-8"), "h")
    assert {f.split()[0] for f in found} == {"compile", "exec", "eval"}
