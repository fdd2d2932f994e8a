"""Helpers for `configs/*.py` files, which are loaded by path (configs/ is not a package).

    from jaxrl_reason.config.files import sibling_config

    def get_config(arg=None):
        c = sibling_config(__file__, "arith_grpo").get_config(arg)   # configs/arith_grpo.py
        c.name = "arith_dapo"
        ...
"""
from __future__ import annotations

import importlib.util
import os
from types import ModuleType


def sibling_config(this_file: str, name: str) -> ModuleType:
    """The config module `<dir of this_file>/<name>.py`, loaded by path (a fresh module each
    call, so two configs never share mutable state). FileNotFoundError names the path."""
    path = os.path.join(os.path.dirname(os.path.abspath(this_file)), f"{name}.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config {path!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"jaxrl_reason_config_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
