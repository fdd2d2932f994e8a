"""Which reward functions a run's config names, bound to their options: `resolve_rewards`
(lookup, option binding with unknown keywords named, the verifier a batch reward needs, and
the refusal of unsandboxed code rewards), `config_options` (`rewards.options` as plain
dicts) and `import_reward_modules` (user modules that register rewards). `RewardPool` and
config validation both use them, so a config is judged the same way in both."""
from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl_reason.rewards.base import (
    RewardFunction,
    available_rewards,
    get_batch_reward,
    get_reward,
)

_log = logging.getLogger("jaxrl_reason.rewards.pool")  # the pool's logger, as before


def _bind(name: str, fn: Any, options: Mapping[str, Any] | None, positional: int) -> Any:
    """`fn` with `options` bound as keywords (after its first `positional` parameters);
    ValueError naming unknown keywords."""
    if not options:
        return fn
    if not isinstance(options, Mapping):
        raise ValueError(f"options of reward {name!r} must be a mapping, got {options!r}")
    params = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    keywords = [k for k, p in params.items() if p.kind in (
        inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)][positional:]
    if not takes_any:
        unknown = sorted(set(options) - set(keywords))
        if unknown:
            raise ValueError(f"reward {name!r} has no option(s) {unknown}; it "
                             f"takes {keywords or 'none'}")
    return functools.update_wrapper(functools.partial(fn, **dict(options)), fn)


def check_sandbox(names: list[str], options: Mapping[str, Mapping]) -> None:
    """Refuse, before any batch, a pool that would run model code without the OS sandbox
    (`code`, or `domain_verifier` whose mixtures may hold code rows) unless the options opt in
    with `allow_unsandboxed_unsafe=True` (RuntimeError naming the fix; see
    `code.sandbox_ready`). Raised per call instead, the error would only count as a reason.
    Also logs, once per process, what isolation the run's reward processes have."""
    from jaxrl_reason.rewards import code, isolation

    isolation.log_status_once(_log)
    if "code" in names:
        code.sandbox_ready(bool(dict(options.get("code") or {}).get(
            "allow_unsandboxed_unsafe", False)))
    if "domain_verifier" in names:
        per_verifier = dict(options.get("domain_verifier") or {}).get("verifier_options") or {}
        code.sandbox_ready(bool(dict(per_verifier.get("code") or {}).get(
            "allow_unsandboxed_unsafe", False)))


def resolve_rewards(
    weights: Mapping[str, float], options: Mapping[str, Mapping] | None, verifier: str
) -> tuple[list[tuple[str, RewardFunction]], list[tuple[str, Any]], dict[str, float]]:
    """Looks up and binds the rewards of `weights`: (per-completion [(name, fn)], batch
    [(name, fn)], extra weights) where extra holds `verifier` at weight 0 when a batch reward
    needs it and it is not weighted. Options of registered but unweighted rewards are
    ignored (configs may list every reward's defaults). Raises ValueError for unknown names
    and unknown options."""
    options = dict(options or {})
    known = set(available_rewards())
    for name in options:
        if name not in known:
            raise ValueError(f"options given for {name!r}, which is not a registered reward "
                             f"(known: {sorted(known)})")
    fns, batch_fns, extra = [], [], {}
    needs_correct = False
    for name in weights:
        spec = get_batch_reward(name)
        if spec is None:
            fns.append((name, _bind(name, get_reward(name), options.get(name), 2)))
        else:
            batch_fns.append((name, _bind(name, spec.fn, options.get(name), 1)))
            needs_correct |= spec.needs_correct
    if needs_correct and verifier not in weights:
        fns.append((verifier, _bind(verifier, get_reward(verifier), options.get(verifier), 2)))
        extra[verifier] = 0.0
    return fns, batch_fns, extra


def config_options(config) -> dict[str, dict]:
    """`rewards.options` of a run config as {reward name: keyword options}: what the RL
    pool, `eval` and the distillation filter bind, so that all three judge alike (e.g. the
    math verifier's `rewards.options.correctness`)."""
    return {k: dict(v) for k, v in dict(config.rewards.get("options", {})).items()}


_IMPORTED_PATHS: set[str] = set()


def import_reward_modules(modules: Sequence[str]) -> None:
    """Imports each module (dotted name, or a path to a .py file) so its rewards register.

    Raises ValueError naming the module when it cannot be imported.
    """
    import importlib
    import importlib.util
    import os

    for module in modules:
        if module in _IMPORTED_PATHS:  # validation and the pool both ask: run a file once
            continue
        try:
            if str(module).endswith(".py"):
                if not os.path.isfile(module):
                    raise FileNotFoundError(f"no such file {module!r}")
                name = "jaxrl_reason_user_" + os.path.splitext(os.path.basename(module))[0]
                spec = importlib.util.spec_from_file_location(name, module)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                _IMPORTED_PATHS.add(module)
            else:
                importlib.import_module(module)
        except Exception as exc:
            raise ValueError(f"rewards.modules: cannot import {module!r}: {exc!r}") from exc
