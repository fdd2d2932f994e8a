"""The math verifier of an older commit, importable next to today's, for side-by-side runs.

    old = load_old_verifier("6a983c8")   # a module: old.correctness, old.is_equivalent

The rewards modules the verifier needs are read with `git show <rev>:<path>` into a fresh
temporary package (`_old_verifier_<rev>`), their `jaxrl_reason.rewards` imports pointed at
it, so the old reward registry, sympy worker pool and parsers are separate from today's
(only `RewardResult` is today's class, which `RewardPool` expects).
"""
from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The commit before the verifier moved onto math-verify (the syntax-tree sympy verifier).
DEFAULT_REV = "6a983c8"


def _rewards_files(rev: str) -> list[str]:
    """The top-level modules of `jaxrl_reason/rewards` at `rev` (all of them: which ones the
    verifier imports changes from revision to revision), without the package's `__init__`
    (whose imports would register every reward)."""
    try:
        out = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:jaxrl_reason/rewards"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except subprocess.CalledProcessError as e:
        raise ValueError(f"git ls-tree {rev}:jaxrl_reason/rewards failed: "
                         f"{e.stderr.strip()}") from e
    return [f for f in out.split() if f.endswith(".py") and f != "__init__.py"]


def load_old_verifier(rev: str = DEFAULT_REV):
    """The `math` module of the rewards package at git revision `rev` (loaded once)."""
    name = f"_old_verifier_{rev}".replace("-", "_").replace("~", "_").replace("^", "_")
    if name + ".math" in sys.modules:
        return sys.modules[name + ".math"]
    pkg = Path(tempfile.mkdtemp(prefix="old_verifier_")) / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for file in _rewards_files(rev):
        text = subprocess.run(["git", "show", f"{rev}:jaxrl_reason/rewards/{file}"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
        (pkg / file).write_text(text.replace("jaxrl_reason.rewards", name))
    sys.path.insert(0, str(pkg.parent))
    try:
        from jaxrl_reason.rewards.base import RewardResult

        # Its own reward registry, but today's result type (RewardPool checks it).
        importlib.import_module(name + ".base").RewardResult = RewardResult
        return importlib.import_module(name + ".math")
    finally:
        sys.path.remove(str(pkg.parent))
