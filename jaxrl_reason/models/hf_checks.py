"""Checks on a Hugging Face model directory that may come from anywhere (a download): the
numbers of its `config.json`, and where its safetensors index points.

`check_config_values(cj, source)` runs before any value of a `config.json` is used
(`hf_config.config_from_hf`); a bad value is a ValueError naming the file and the field:

- sizes and counts are JSON integers (not booleans, not floats) within these bounds, far
  above any published model and far below what would exhaust memory or overflow an index:

  | field | bound |
  |---|---|
  | `vocab_size` | 1 .. 2^24 (16,777,216; Gemma 3: 262,208) |
  | `hidden_size`, `head_dim` | 1 .. 2^16 |
  | `intermediate_size` | 1 .. 2^20 |
  | `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`, `sliding_window_pattern` | 1 .. 2^12 |
  | `max_position_embeddings`, `original_max_position_embeddings`, `sliding_window` | 1 .. 2^26 |

- `rope_theta`, `rope_local_base_freq` and the rope-scaling `factor`, `low_freq_factor` and
  `high_freq_factor` (in `rope_scaling`, `rope_parameters` or its per-layer-type dicts):
  finite numbers > 0 (not booleans);
- `rms_norm_eps`: a finite number in (0, 1);
- `final_logit_softcapping`, `attn_logit_softcapping`, `query_pre_attn_scalar`: null or a
  finite number > 0.

`weight_file(model_dir, name, index)` resolves a file a safetensors index names: a plain
relative path (no absolute path, no `..`, no empty, `.` or NUL component) whose real path
(symlinks resolved) lies inside the model directory, or, for the Hugging Face cache layout
(`models--ORG--NAME/snapshots/REV/` whose files are symlinks to `../../blobs/HASH`), inside
that repository's `blobs` directory. Anything else is a ValueError naming the index and
the entry.
"""

from __future__ import annotations

import math
import os
from typing import Any

_INT_BOUNDS = {
    "vocab_size": 2**24,
    "hidden_size": 2**16,
    "head_dim": 2**16,
    "intermediate_size": 2**20,
    "num_hidden_layers": 2**12,
    "num_attention_heads": 2**12,
    "num_key_value_heads": 2**12,
    "max_position_embeddings": 2**26,
    "original_max_position_embeddings": 2**26,
    "sliding_window": 2**26,
    "sliding_window_pattern": 2**12,
    "_sliding_window_pattern": 2**12,
}
_POSITIVE_FLOATS = ("rope_theta", "rope_local_base_freq")
_ROPE_FLOATS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor")
_OPTIONAL_POSITIVE = ("final_logit_softcapping", "attn_logit_softcapping",
                      "query_pre_attn_scalar")
_ROPE_KEYS = ("rope_scaling", "rope_parameters")


def _is_number(value: Any) -> bool:
    """A JSON number (int or float), not a boolean."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_float(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value) and value > 0


def _int_problem(value: Any, bound: int) -> str | None:
    """Why `value` is not an integer in [1, bound], or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, got {value!r}"
    if not 1 <= value <= bound:
        return f"must be between 1 and {bound}, got {value!r}"
    return None


def _rope_dicts(cj: dict) -> list[tuple[str, dict]]:
    """(field path, dict) of every RoPE parameter dict of a config: `rope_scaling`,
    `rope_parameters` and the per-layer-type dicts nested in it."""
    out = []
    for key in _ROPE_KEYS:
        spec = cj.get(key)
        if isinstance(spec, dict):
            out.append((key, spec))
            out += [(f"{key}.{k}", v) for k, v in spec.items() if isinstance(v, dict)]
    return out


def check_config_values(cj: dict, source: str) -> None:
    """Checks the numbers of a (text) `config.json` dict `cj` against the table of the
    module docstring; ValueError "`source`: field `name` ..." for the first bad one. Absent
    or null fields are left to the caller's defaults."""
    def bad(name: str, why: str) -> ValueError:
        return ValueError(f"{source}: field {name!r} {why}")

    for name, bound in _INT_BOUNDS.items():
        if cj.get(name) is not None:
            problem = _int_problem(cj[name], bound)
            if problem is not None:
                raise bad(name, problem)
    for name in _POSITIVE_FLOATS:
        if cj.get(name) is not None and not _positive_float(cj[name]):
            raise bad(name, f"must be a finite number > 0, got {cj[name]!r}")
    eps = cj.get("rms_norm_eps")
    if eps is not None and not (_positive_float(eps) and eps < 1):
        raise bad("rms_norm_eps", f"must be a finite number in (0, 1), got {eps!r}")
    for name in _OPTIONAL_POSITIVE:
        if cj.get(name) is not None and not _positive_float(cj[name]):
            raise bad(name, f"must be null or a finite number > 0, got {cj[name]!r}")
    for key in _ROPE_KEYS:
        if cj.get(key) is not None and not isinstance(cj[key], dict):
            raise bad(key, f"must be an object or null, got {type(cj[key]).__name__}")
    for where, spec in _rope_dicts(cj):
        for name in _ROPE_FLOATS:
            if spec.get(name) is not None and not _positive_float(spec[name]):
                raise bad(f"{where}.{name}", f"must be a finite number > 0, got "
                                             f"{spec[name]!r}")
        original = spec.get("original_max_position_embeddings")
        if original is not None:
            problem = _int_problem(original, _INT_BOUNDS["original_max_position_embeddings"])
            if problem is not None:
                raise bad(f"{where}.original_max_position_embeddings", problem)


def _allowed_roots(model_dir: str) -> list[str]:
    """Real directories a model directory's weight files may resolve into: the directory
    itself and, in the Hugging Face cache layout (`models--*/snapshots/<rev>`), the
    repository's `blobs` directory."""
    root = os.path.realpath(model_dir)
    roots = [root]
    snapshots, repo = os.path.dirname(root), os.path.dirname(os.path.dirname(root))
    if os.path.basename(snapshots) == "snapshots" and \
            os.path.basename(repo).startswith("models--"):
        roots.append(os.path.join(repo, "blobs"))
    return roots


def weight_file(model_dir: str, name: Any, index: str) -> str:
    """The path of the weight file `name` (an entry of the safetensors index `index`) in
    `model_dir`, checked as the module docstring says; ValueError naming `index` and
    `name` for an entry that is not a plain relative path or resolves outside."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{index}: weight_map entry {name!r} is not a file name")
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or "\x00" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{index}: weight_map entry {name!r} is not a plain relative path "
                         f"inside the model directory")
    full = os.path.join(model_dir, name)
    real = os.path.realpath(full)
    if not any(os.path.commonpath([real, r]) == r for r in _allowed_roots(model_dir)):
        raise ValueError(f"{index}: weight_map entry {name!r} resolves to {real}, outside "
                         f"the model directory {os.path.realpath(model_dir)}")
    return full
