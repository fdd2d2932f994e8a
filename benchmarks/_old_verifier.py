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
_FILES = ("math.py", "_latex.py", "_latex_structures.py", "_latex_sympy.py", "_sympy_worker.py",
          "_sympy_child.py", "_sympy_tree.py", "_latex_verify.py", "base.py", "isolation.py")
_OPTIONAL = ("_latex_structures.py", "_latex_sympy.py", "_latex_verify.py",
             "_sympy_child.py")  # not in every rev


def load_old_verifier(rev: str = DEFAULT_REV):
    """The `math` module of the rewards package at git revision `rev` (loaded once)."""
    name = f"_old_verifier_{rev}".replace("-", "_").replace("~", "_").replace("^", "_")
    if name + ".math" in sys.modules:
        return sys.modules[name + ".math"]
    pkg = Path(tempfile.mkdtemp(prefix="old_verifier_")) / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for file in _FILES:
        try:
            text = subprocess.run(["git", "show", f"{rev}:jaxrl_reason/rewards/{file}"], cwd=ROOT,
                                  capture_output=True, text=True, check=True).stdout
        except subprocess.CalledProcessError as e:
            if file in _OPTIONAL:
                continue
            raise ValueError(f"git show {rev}:jaxrl_reason/rewards/{file} failed: "
                             f"{e.stderr.strip()}") from e
        (pkg / file).write_text(text.replace("jaxrl_reason.rewards", name))
    sys.path.insert(0, str(pkg.parent))
    try:
        from jaxrl_reason.rewards.base import RewardResult

        # Its own reward registry, but today's result type (RewardPool checks it).
        importlib.import_module(name + ".base").RewardResult = RewardResult
        return importlib.import_module(name + ".math")
    finally:
        sys.path.remove(str(pkg.parent))
