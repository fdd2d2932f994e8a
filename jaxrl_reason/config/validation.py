"""Config validation before anything is compiled: every problem reported at once, by key.

    problems = validate_config(config, num_devices)   # list of "key: what is wrong"
    check_config(config, num_devices)                 # raises ConfigError listing all
"""

from __future__ import annotations

import glob
import math
import numbers
import os
from typing import Any

import ml_collections

from jaxrl_reason.runtime import paths
from jaxrl_reason.data.mixture import MIXTURE_TASK, mixture_problems
from jaxrl_reason.data.tasks import get_task
from jaxrl_reason.models.config import ATTENTION_IMPLS
from jaxrl_reason.rewards.pool import import_reward_modules, resolve_rewards
from jaxrl_reason.rl.advantages import ADVANTAGE_ESTIMATORS, ADVANTAGE_SCALES
from jaxrl_reason.rl.losses import KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSS_MODES
from jaxrl_reason.runtime.sharding import MESH_AXES, resolve_mesh_shape, rule_axes
from jaxrl_reason.tools import tool_config_problems

# Algorithms whose baseline is the group: they need at least two samples per prompt.
GROUP_ESTIMATORS = ("grpo", "rloo", "passk")


class ConfigError(ValueError):
    """A config failed validation; `problems` lists each 'key: message'."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid config:\n  - " + "\n  - ".join(problems))


def _get(config, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, (ml_collections.ConfigDict, dict)) or part not in node:
            return default
        node = node[part]
    return node


def non_finite_problems(node: Any, prefix: str = "config") -> list[str]:
    """'config.<key> = <value>: must be a finite number' for every NaN or +-inf float in
    `node` (a ConfigDict, dict, list or tuple, walked to any depth; ints and bools cannot
    be non-finite). No config field takes inf as a setting, so none is exempt."""
    problems: list[str] = []
    stack = [(prefix, node)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, (ml_collections.ConfigDict, dict)):
            items = value.items()
            stack.extend((f"{where}.{k}", v) for k, v in reversed(list(items)))
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif (isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
              and not math.isfinite(value)):
            problems.append(f"{where} = {value!r}: must be a finite number")
    return problems


def _positive_int(problems, config, key):
    value = _get(config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        problems.append(f"{key}: must be a positive integer, got {value!r}")
        return None
    return value


def _in_range(problems, config, key, low, high, *, low_open=False, high_open=False):
    value = _get(config, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"{key}: must be a number, got {value!r}")
        return
    # Written as "inside" so that NaN, which fails every comparison, is outside.
    inside = ((low < value) if low_open else (low <= value)) and \
        ((value < high) if high_open else (value <= high))
    if not inside:
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        problems.append(f"{key}: must be in {lo}{low}, {high}{hi}, got {value!r}")


def _one_of(problems, config, key, choices):
    value = _get(config, key)
    if value not in choices:
        problems.append(f"{key}: must be one of {sorted(choices)}, got {value!r}")


def _mesh_problems(config, num_devices) -> tuple[list[str], int | None]:
    try:
        sizes = dict(zip(MESH_AXES, resolve_mesh_shape(dict(config.mesh), num_devices)))
    except ValueError as e:
        return [f"mesh: {e}"], None
    batch_axes = rule_axes(config.sharding_rules, "batch")
    return [], math.prod(sizes[a] for a in batch_axes if a in sizes)


def _resolved_context(config, num_devices: int) -> int:
    """The context size of `config`'s mesh on `num_devices` devices (mesh.context = -1
    resolved); 1 when the mesh does not resolve (`_mesh_problems` says why)."""
    try:
        sizes = dict(zip(MESH_AXES, resolve_mesh_shape(dict(config.mesh), num_devices)))
    except (ValueError, TypeError):
        return 1
    return int(sizes.get("context", 1))


def _split_problems(config, dp: int | None) -> list[str]:
    """The batches of `config` that do not split evenly over `dp` data-parallel shards."""
    problems: list[str] = []
    prompts, group = _get(config, "rl.batch_prompts"), _get(config, "rl.num_generations")
    micro = _get(config, "rl.micro_batches", 1)
    packed = _get(config, "rl.packing", False) is True  # micro-batches of packs, not rows
    if dp and isinstance(micro, int) and micro >= 1 and isinstance(prompts, int) \
            and isinstance(group, int) and not packed and (prompts * group) % (dp * micro):
        problems.append(f"rl.micro_batches: {prompts} x {group} = {prompts * group} rows do not "
                        f"split into {micro} micro-batches x {dp} data-parallel shards")
    if dp and isinstance(prompts, int) and isinstance(group, int) and (prompts * group) % dp:
        problems.append(
            f"rl.batch_prompts: {prompts} prompts x {group} generations = {prompts * group} "
            f"rows do not split over the {dp} data-parallel shards of the mesh")
    sft_batch = _get(config, "sft.batch_size")
    if dp and isinstance(sft_batch, int) and sft_batch % dp:
        problems.append(f"sft.batch_size: {sft_batch} does not split over the {dp} "
                        f"data-parallel shards of the mesh")
    sft_micro = _get(config, "sft.micro_batches", 1)
    if dp and isinstance(sft_micro, int) and sft_micro >= 1 and isinstance(sft_batch, int) \
            and not _get(config, "sft.packing", False) and sft_batch % (dp * sft_micro):
        problems.append(f"sft.micro_batches: sft.batch_size {sft_batch} does not split into "
                        f"{sft_micro} micro-batches x {dp} data-parallel shards")
    n, eval_prompts = _get(config, "eval.num_samples"), _get(config, "eval.batch_prompts")
    if dp and isinstance(n, int) and isinstance(eval_prompts, int) and (n * eval_prompts) % dp:
        problems.append(f"eval.batch_prompts: {eval_prompts} prompts x {n} samples do not "
                        f"split over the {dp} data-parallel shards of the mesh")
    return problems


def fits_devices(config: ml_collections.ConfigDict, num_devices: int) -> bool:
    """Whether `config`'s mesh fits `num_devices` devices and its batches split over the
    resulting data-parallel shards (what `cpu_devices` = 0, auto, needs of a count)."""
    mesh_problems, dp = _mesh_problems(config, num_devices)
    return not mesh_problems and not _split_problems(config, dp)


def validate_config(config: ml_collections.ConfigDict, num_devices: int) -> list[str]:
    """All problems of a train/sft/eval config, as 'key: message' strings (empty if valid)."""
    problems = non_finite_problems(config)  # first: NaN passes every range check below
    mesh_problems, dp = _mesh_problems(config, num_devices)
    problems += mesh_problems

    problems += _task_problems(config)
    if _get(config, "requires_hf_model", False) and not _get(config, "hf_model", ""):
        problems.append("hf_model: this config trains a real model: give its local Hugging "
                        "Face directory, --config.hf_model=/path/to/model (or use :smoke)")
    buckets = _get(config, "task.prompt_buckets", ())
    if not buckets or not all(isinstance(b, int) and b > 0 for b in buckets):
        problems.append(f"task.prompt_buckets: must be positive integers, got {buckets!r}")

    for key in ("sft.steps", "sft.batch_size", "sft.num_examples", "sft.max_completion_length",
                "rl.steps", "rl.batch_prompts", "rl.num_generations", "rl.max_new_tokens",
                "rl.num_iterations", "rl.train_length_bucket", "rl.train_row_buckets",
                "sft.length_bucket", "eval.num_problems", "eval.num_samples",
                "eval.max_new_tokens", "eval.batch_prompts",
                "checkpoint.every_steps", "checkpoint.max_to_keep", "rewards.num_workers"):
        _positive_int(problems, config, key)
    for key in ("sft.learning_rate", "rl.learning_rate"):
        _in_range(problems, config, key, 0.0, 1.0, low_open=True)
    _in_range(problems, config, "rl.epsilon_low", 0.0, 1.0, low_open=True, high_open=True)
    _in_range(problems, config, "rl.epsilon_high", 0.0, 10.0, low_open=True)
    _in_range(problems, config, "rl.beta", 0.0, 1e3)
    _in_range(problems, config, "rl.top_p", 0.0, 1.0, low_open=True)
    _in_range(problems, config, "eval.top_p", 0.0, 1.0, low_open=True)
    _in_range(problems, config, "rewards.timeout_s", 0.0, 3600.0, low_open=True)
    # optional (older configs lack them): the reward pool's wall-clock backstop, and what
    # an evaluation does with answers left unscored
    for key, low, high, low_open in (("rewards.backstop_factor", 1.0, 1000.0, False),
                                     ("eval.retry_limit_factor", 1.0, 1000.0, False),
                                     ("eval.max_unscored_share", 0.0, 1.0, False)):
        if _get(config, key) is not None:
            _in_range(problems, config, key, low, high, low_open=low_open)
    _one_of(problems, config, "rl.loss_type", LOSS_AGGREGATIONS)
    _one_of(problems, config, "rl.lr_decay", ("constant", "cosine"))
    _one_of(problems, config, "rl.kl_estimator", KL_ESTIMATORS)
    _one_of(problems, config, "rl.advantage_estimator", tuple(ADVANTAGE_ESTIMATORS) + ("gae",))
    _one_of(problems, config, "rl.policy_loss_mode", POLICY_LOSS_MODES)
    problems += _algorithm_problems(config)
    problems += _passk_problems(config)
    _one_of(problems, config, "kernels.backend", ("auto", "pallas", "reference"))
    if _get(config, "model.attention_impl") is not None:  # optional: older configs lack it
        _one_of(problems, config, "model.attention_impl", ATTENTION_IMPLS)
    _one_of(problems, config, "rl.advantage_scale", ADVANTAGE_SCALES)

    group = _get(config, "rl.num_generations")
    if (isinstance(group, int) and group < 2
            and _get(config, "rl.advantage_estimator") in GROUP_ESTIMATORS):
        problems.append(
            f"rl.num_generations: {_get(config, 'rl.advantage_estimator')} needs a group of at "
            f"least 2 samples per prompt (its baseline is the group), got {group}")
    if _get(config, "rl.dynamic_sampling") and isinstance(group, int) and group < 2:
        problems.append(f"rl.dynamic_sampling: needs rl.num_generations >= 2 (it keeps groups "
                        f"whose rewards differ), got {group}")
    if isinstance(_get(config, "rl.dynamic_sampling_max_rounds"), int) \
            and _get(config, "rl.dynamic_sampling_max_rounds") < 0:
        problems.append("rl.dynamic_sampling_max_rounds: must be >= 0")
    kl_target = _get(config, "rl.kl_target", 0.0)
    if isinstance(kl_target, (int, float)) and kl_target < 0:
        problems.append(f"rl.kl_target: must be >= 0 (0 = fixed beta), got {kl_target}")
    if isinstance(kl_target, (int, float)) and kl_target > 0 and not _get(config, "rl.beta", 0) > 0:
        problems.append("rl.kl_target: the adaptive KL controller needs an initial rl.beta > 0")
    if _get(config, "rl.kl_target", 0.0):
        _in_range(problems, config, "rl.kl_horizon", 0.0, 1e12, low_open=True)
    if _get(config, "rl.ref_sync_every", 0):
        _in_range(problems, config, "rl.ref_sync_alpha", 0.0, 1.0, low_open=True)
    for key in ("rl.offload_reference", "rl.offload_optimizer"):
        if not isinstance(_get(config, key, False), bool):
            problems.append(f"{key}: must be True or False, got {_get(config, key)!r}")
    for key in ("rl.micro_batches", "sft.micro_batches"):
        micro = _get(config, key, 1)
        if not (isinstance(micro, int) and not isinstance(micro, bool) and micro >= 1):
            problems.append(f"{key}: must be an int >= 1, got {micro!r}")
    problems += _split_problems(config, dp)
    context = _resolved_context(config, num_devices)
    problems += _packing_problems(config, context)
    problems += _sft_packing_problems(config, context)
    problems += _context_problems(config, num_devices, context, dp)
    problems += _refill_problems(config, dp, context)
    problems += _partial_rollout_problems(config)
    problems += _staleness_problems(config)
    bucket = _get(config, "rl.train_length_bucket")
    if isinstance(bucket, int) and isinstance(_get(config, "rl.max_new_tokens"), int) \
            and bucket > config.rl.max_new_tokens:
        problems.append(f"rl.train_length_bucket: {bucket} exceeds rl.max_new_tokens "
                        f"{config.rl.max_new_tokens}")
    problems += _reward_problems(config)
    problems += _reward_model_problems(config)
    problems += _tool_problems(config)
    return problems


PACKED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def _pack_knob_problems(config, section: str, budget_key: str,
                        context: int = 1) -> list[str] | None:
    """`<section>.packing` and `<section>.pack_tokens` (section "rl" or "sft"): the flag is
    a bool, the pack holds the longest row (largest task.prompt_buckets + `budget_key` - 1
    tokens) and, under context parallelism, divides by mesh.context. None when packing is
    off; else the problems (empty when none)."""
    packing = _get(config, f"{section}.packing", False)
    if not isinstance(packing, bool):
        return [f"{section}.packing: must be True or False, got {packing!r}"]
    if not packing:
        return None
    tokens = _get(config, f"{section}.pack_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        return [f"{section}.pack_tokens: must be an int >= 1 (tokens per pack) with "
                f"{section}.packing, got {tokens!r}"]
    problems = []
    buckets, budget = _get(config, "task.prompt_buckets", ()), _get(config, budget_key)
    if buckets and all(isinstance(b, int) for b in buckets) and isinstance(budget, int) \
            and tokens < max(buckets) + budget - 1:
        problems.append(f"{section}.pack_tokens: {tokens} cannot hold the longest row, "
                        f"{max(buckets) + budget - 1} tokens (largest task.prompt_buckets "
                        f"{max(buckets)} + {budget_key} {budget} - 1)")
    if context > 1 and tokens % context:
        problems.append(f"{section}.pack_tokens: {tokens} does not divide by "
                        f"mesh.context={context} (each context shard holds pack_tokens / "
                        "context tokens)")
    return problems


def _sft_packing_problems(config, context: int = 1) -> list[str]:
    """sft.packing (padding-free packs for the SFT step) and sft.pack_tokens."""
    return _pack_knob_problems(config, "sft", "sft.max_completion_length", context) or []


def _packing_problems(config, context: int = 1) -> list[str]:
    """rl.packing (padding-free packs for the log-prob passes and the update) and
    rl.pack_tokens, and what packing does not cover."""
    problems = _pack_knob_problems(config, "rl", "rl.max_new_tokens", context)
    if problems is None:
        return []
    loss_type = _get(config, "rl.loss_type")
    if loss_type not in PACKED_LOSS_TYPES:
        problems.append(f"rl.packing: packs the {'/'.join(PACKED_LOSS_TYPES)} losses, not "
                        f"rl.loss_type {loss_type!r}")
    return problems


def _context_problems(config, num_devices: int, resolved: int, dp: int | None) -> list[str]:
    """mesh.context (context parallelism; `resolved`: its size on the devices, -1 resolved):
    it must divide the devices, the sharding rules must map the activations' "length" onto
    it, it splits packed passes, so each phase that runs packs (rl.packing, and
    sft.packing when SFT runs; `_pack_knob_problems` checks that pack_tokens divides by
    it), and the sampler's rows split over data x context."""
    context = _get(config, "mesh.context", 1)
    if not isinstance(context, int) or isinstance(context, bool) or context < 1:
        if context != -1:
            return [f"mesh.context: must be an int >= 1 (or -1), got {context!r}"]
    elif num_devices % context:
        return [f"mesh.context: {context} does not divide the {num_devices} devices"]
    if resolved == 1:
        return []
    target = dict(config.sharding_rules).get("length")
    problems = []
    if "context" not in rule_axes(config.sharding_rules, "length"):
        problems.append(f"sharding_rules: mesh.context={resolved} needs the rule "
                        f"('length', 'context'), got length -> {target!r}")
    if not _get(config, "rl.packing", False):
        problems.append(f"mesh.context: context parallelism ({resolved}) splits the packed "
                        "training passes; set rl.packing=True")
    if not _get(config, "sft.packing", False):
        problems.append(f"mesh.context: context parallelism ({resolved}) splits packed SFT "
                        "steps too; set sft.packing=True")
    prompts, group = _get(config, "rl.batch_prompts"), _get(config, "rl.num_generations")
    if dp and isinstance(prompts, int) and isinstance(group, int) \
            and (prompts * group) % (dp * resolved):
        problems.append(f"rl.batch_prompts: {prompts} x {group} = {prompts * group} rows do not "
                        f"split over {dp} data-parallel x {resolved} context shards (the "
                        "sampler splits its rows over both)")
    return problems


def _refill_problems(config, dp: int | None, context: int = 1) -> list[str]:
    """rl.max_num_seqs (slot-refill slots) and rl.refill_every."""
    slots, every = _get(config, "rl.max_num_seqs", 0), _get(config, "rl.refill_every", 8)
    if not (isinstance(slots, int) and slots >= 0):
        return [f"rl.max_num_seqs: must be an int >= 0 (0 = static batch), got {slots!r}"]
    problems = [] if isinstance(every, int) and every >= 1 else [
        f"rl.refill_every: must be an int >= 1 (decode steps between refills), got {every!r}"]
    least = _get(config, "rl.refill_min_slots", 4)
    if not (isinstance(least, int) and not isinstance(least, bool) and least >= 0):
        problems.append(f"rl.refill_min_slots: must be an int >= 0 (fewest slots the tail "
                        f"shrinks to; 0 = never shrink), got {least!r}")
    prompts, group = _get(config, "rl.batch_prompts"), _get(config, "rl.num_generations")
    rows = prompts * group if isinstance(prompts, int) and isinstance(group, int) else None
    if slots and rows is not None and slots > rows:
        problems.append(f"rl.max_num_seqs: {slots} slots is more than the {rows} rows of a "
                        f"rollout batch (rl.batch_prompts x rl.num_generations)")
    if slots and dp and slots % (dp * context):
        where = "" if context == 1 else (f" x {context} context shards (the sampler splits "
                                         "its rows over both)")
        problems.append(f"rl.max_num_seqs: {slots} slots do not split over the {dp} "
                        f"data-parallel shards{where} of the mesh")
    if slots and _get(config, "tools.enabled", False):
        problems.append("rl.max_num_seqs: slot refill does not run tool calls; set it to 0 "
                        "with tools.enabled")
    return problems


def _partial_rollout_problems(config) -> list[str]:
    """rl.rollout_token_budget (partial rollouts; 0 or None = off), rl.max_rollout_age, and
    what partial rollouts cannot combine with."""
    budget = _get(config, "rl.rollout_token_budget", 0)
    if budget is None or budget == 0 and not isinstance(budget, bool):
        return []
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        return [f"rl.rollout_token_budget: must be a whole number of decode steps >= 1 "
                f"(0 or None = off), got {budget!r}"]
    problems = []
    age = _get(config, "rl.max_rollout_age", None)
    if not isinstance(age, int) or isinstance(age, bool) or age < 1:
        problems.append(f"rl.max_rollout_age: must be an int >= 1 (steps a pending row may "
                        f"wait before it is dropped) with rl.rollout_token_budget, got {age!r}")
    tis = _get(config, "rl.tis_cap", 0.0)
    if not (isinstance(tis, (int, float)) and tis > 0):
        problems.append("rl.rollout_token_budget: partial rollouts train on tokens of older "
                        "policies; set rl.tis_cap > 0 (the truncated importance weight "
                        "against their behaviour log-probs, e.g. 2.0)")
    for key, what in _off_policy_conflicts(config):
        problems.append(f"rl.rollout_token_budget: partial rollouts do not support {what}; "
                        f"set {key} off or rl.rollout_token_budget=0")
    return problems


def _off_policy_conflicts(config) -> list[tuple[str, str]]:
    """(key, what) of the switches on in `config` that the off-policy rollout modes (partial
    rollouts, bounded staleness) do not combine with yet: the PPO critic, dynamic sampling,
    tool-use rollouts."""
    switches = (("rl.advantage_estimator", _get(config, "rl.advantage_estimator") == "gae",
                 "the PPO critic (advantage_estimator='gae')"),
                ("rl.dynamic_sampling", bool(_get(config, "rl.dynamic_sampling", False)),
                 "DAPO dynamic sampling"),
                ("tools.enabled", bool(_get(config, "tools.enabled", False)),
                 "tool-use rollouts"))
    return [(key, what) for key, on, what in switches if on]


def _staleness_problems(config) -> list[str]:
    """rl.max_staleness (batches sampled ahead of the update; 0 or None = synchronous) and
    what it cannot combine with yet."""
    k = _get(config, "rl.max_staleness", 0)
    if k is None or (k == 0 and not isinstance(k, bool)):
        return []
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        return [f"rl.max_staleness: must be a whole number of steps >= 0 (0 = synchronous), "
                f"got {k!r}"]
    problems = []
    tis = _get(config, "rl.tis_cap", 0.0)
    if not (isinstance(tis, (int, float)) and tis > 0):
        problems.append("rl.max_staleness: batches sampled by older policies need the "
                        "decoupled objective's behaviour weight; set rl.tis_cap > 0 (e.g. 2.0)")
    conflicts = _off_policy_conflicts(config)
    if _get(config, "rl.rollout_token_budget", 0):
        conflicts.insert(0, ("rl.rollout_token_budget", "partial rollouts"))
    for key, what in conflicts:
        problems.append(f"rl.max_staleness: not supported with {what} yet; set {key} off "
                        f"or rl.max_staleness=0")
    return problems


def _tool_problems(config) -> list[str]:
    """config.tools (optional: off when absent or not enabled) and what it cannot combine
    with yet; task.tool_demo_fraction."""
    tools = _get(config, "tools")
    if tools is not None and not isinstance(tools, (dict, ml_collections.ConfigDict)):
        return [f"tools: must be a config block (tools.enabled, tools.names, ...), got {tools!r}"]
    problems = tool_config_problems(tools)
    if tools is not None and tools.get("enabled", False):
        if not isinstance(tools.get("enabled"), bool):
            problems.append(f"tools.enabled: must be True or False, got {tools.get('enabled')!r}")
        if _get(config, "rl.kl_in_reward", False):
            problems.append("rl.kl_in_reward: not supported with tools.enabled yet (the "
                            "KL-in-reward sum would count result tokens)")
    fraction = _get(config, "task.tool_demo_fraction", 0.0)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0.0 <= fraction <= 1.0:
        problems.append(f"task.tool_demo_fraction: must be a fraction in [0, 1], got "
                        f"{fraction!r}")
    return problems


def _passk_problems(config) -> list[str]:
    """rl.passk_k (optional: older configs lack it; 0 = unset) and what "passk" needs: its k
    in [1, rl.num_generations], and a reward that can only be 0 or 1 (one reward component
    weighted 1.0, no KL or reward model in it; the trainer checks the values too)."""
    estimator, k = _get(config, "rl.advantage_estimator"), _get(config, "rl.passk_k", 0)
    group = _get(config, "rl.num_generations")
    if estimator != "passk":
        if k not in (0, None):
            return [f"rl.passk_k: {k!r} is read by rl.advantage_estimator 'passk' only, not "
                    f"{estimator!r}; set it to 0 or use 'passk'"]
        return []
    problems = []
    if isinstance(k, bool) or not isinstance(k, int) or not (
            isinstance(group, int) and 1 <= k <= group):
        problems.append(f"rl.passk_k: advantage_estimator 'passk' needs the k of its pass@k "
                        f"objective, an int in [1, rl.num_generations={group!r}], got {k!r}")
    weights = {name: w for name, w in dict(_get(config, "rewards.weights", {}) or {}).items()
               if w != 0}
    if len(weights) != 1 or list(weights.values())[0] != 1:
        problems.append(f"rewards.weights: advantage_estimator 'passk' counts correct samples "
                        f"and needs 0/1 rewards: weight one 0/1 component 1.0 and the others "
                        f"0 (e.g. --config.rewards.weights.format_strict=0.0), got "
                        f"{weights or dict(_get(config, 'rewards.weights', {}) or {})}")
    if _get(config, "rl.kl_in_reward", False):
        problems.append("rl.kl_in_reward: advantage_estimator 'passk' needs 0/1 rewards; the "
                        "KL penalty in the reward makes them continuous")
    if _get(config, "rewards.reward_model_weight", 0.0) not in (0, 0.0, None):
        problems.append("rewards.reward_model_weight: advantage_estimator 'passk' needs 0/1 "
                        "rewards; a reward model's score is continuous (use weight 0)")
    return problems


def _algorithm_problems(config) -> list[str]:
    problems = []
    mode = _get(config, "rl.policy_loss_mode", "ppo")
    clip_c = _get(config, "rl.clip_ratio_c", 0.0)
    if isinstance(clip_c, (int, float)) and clip_c != 0:
        if clip_c <= 1:
            problems.append(f"rl.clip_ratio_c: the dual-clip bound must be > 1 (or 0 = off), "
                            f"got {clip_c}")
        if mode == "cispo":
            problems.append("rl.clip_ratio_c: dual clip does not apply to policy_loss_mode "
                            "'cispo' (its IS weights are already clipped)")
    tis = _get(config, "rl.tis_cap", 0.0)
    if isinstance(tis, (int, float)) and tis < 0:
        problems.append(f"rl.tis_cap: must be > 0 (or 0 = off), got {tis}")
    if _get(config, "rl.kl_in_reward") and not _get(config, "rl.beta", 0) > 0:
        problems.append("rl.kl_in_reward: needs rl.beta > 0 (the KL coefficient)")
    if _get(config, "rl.advantage_estimator") == "gae":
        value = _get(config, "rl.value")
        if not isinstance(value, (dict, ml_collections.ConfigDict)):
            return problems + ["rl.value: PPO (advantage_estimator='gae') needs a value model "
                               "config (rl.value.init, learning_rate, clip_range, ...)"]
        _one_of(problems, config, "rl.value.init", ("policy", "sft", "random"))
        _in_range(problems, config, "rl.value.learning_rate", 0.0, 1.0, low_open=True)
        _in_range(problems, config, "rl.gamma", 0.0, 1.0)
        _in_range(problems, config, "rl.lam", 0.0, 1.0)
        if mode == "gspo":
            problems.append("rl.policy_loss_mode: 'gspo' needs one advantage per sequence; "
                            "with GAE use 'ppo' or 'cispo'")
    return problems


def _task_problems(config) -> list[str]:
    problems = []
    try:
        task = get_task(_get(config, "task.name"))
    except ValueError as e:
        return [f"task.name: {e}"]
    if task.name == "file":
        return _file_task_problems(config)
    if task.name == MIXTURE_TASK:  # each domain has its own levels (data/mixture.py)
        return (mixture_problems(config.task, _get(config, "rewards.weights", {}) or {},
                                 get_task) + _length_target_problems(config))
    if _get(config, "task.mixture", ()):
        problems.append(f"task.mixture: is set but task.name is {task.name!r}; set "
                        f"task.name='{MIXTURE_TASK}' to train on the mixture, or clear it")
    top = task.max_level
    levels = _get(config, "task.train_levels", ())
    if not levels or not all(isinstance(v, int) and 1 <= v <= top for v in levels):
        problems.append(f"task.train_levels: must be a non-empty list of {task.name} levels "
                        f"in 1..{top}, got {levels!r}")
    for group in _get(config, "task.eval_levels", ()):
        if not group or not all(isinstance(v, int) and 1 <= v <= top for v in group):
            problems.append(f"task.eval_levels: each set must list {task.name} levels in "
                            f"1..{top}, got {group!r}")
    return problems + _length_target_problems(config)


def _length_target_problems(config) -> list[str]:
    targets = _get(config, "task.length_targets", (0, 0))
    if not (isinstance(targets, (tuple, list)) and len(targets) == 2
            and all(isinstance(t, int) and not isinstance(t, bool) for t in targets)
            and (tuple(targets) == (0, 0) or 0 < targets[0] <= targets[1])):
        return [f"task.length_targets: must be (low, high) token budgets with "
                f"0 < low <= high, or (0, 0) for none; got {targets!r}"]
    return []


def _file_task_problems(config) -> list[str]:
    problems = []
    paths = {"task.train_file": _get(config, "task.train_file")}
    eval_files = _get(config, "task.eval_files", {})
    paths.update({f"task.eval_files.{k}": v for k, v in dict(eval_files or {}).items()})
    for key, path in paths.items():
        if not isinstance(path, str) or not path:
            problems.append(f"{key}: must be a path, got {path!r}")
        elif not (os.path.exists(path) or glob.glob(path)):
            problems.append(f"{key}: {path!r} does not exist")
    _one_of(problems, config, "task.format", ("auto", "jsonl", "parquet"))
    _one_of(problems, config, "task.preset", ("gsm8k", "math", "generic"))
    _one_of(problems, config, "task.on_error", ("raise", "skip"))
    try:
        from jaxrl_reason.data.templates import get_template
        get_template(_get(config, "task.template") or "plain")
    except (ValueError, TypeError) as e:
        problems.append(f"task.template: {e}")
    return problems


def _reward_problems(config) -> list[str]:
    weights = _get(config, "rewards.weights", {})
    if not weights:
        return ["rewards.weights: at least one reward component is needed"]
    try:
        import_reward_modules(tuple(_get(config, "rewards.modules", ())))
    except ValueError as e:
        return [str(e)]
    options = {k: (dict(v) if isinstance(v, (dict, ml_collections.ConfigDict)) else v)
               for k, v in dict(_get(config, "rewards.options", {})).items()}
    try:
        verifier = get_task(_get(config, "task.name")).verifier
    except ValueError:
        verifier = "correctness"
    problems = []
    for name, weight in dict(weights).items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not math.isfinite(weight):
            problems.append(f"rewards.weights.{name}: must be a finite number, got {weight!r}")
    try:
        resolve_rewards(dict(weights), options, verifier)
    except ValueError as e:
        key = "rewards.options" if "option" in str(e) else "rewards.weights"
        problems.append(f"{key}: {e}")
    return problems


def _reward_model_problems(config) -> list[str]:
    """rewards.reward_model_dir / _weight / _normalize (each optional: older configs lack them)."""
    problems = []
    directory = _get(config, "rewards.reward_model_dir", "")
    weight = _get(config, "rewards.reward_model_weight", 0.0)
    if not isinstance(directory, str):
        problems.append(f"rewards.reward_model_dir: must be a path or \"\", got {directory!r}")
    elif directory and not paths.as_path(directory).is_dir():
        problems.append(f"rewards.reward_model_dir: {directory!r} is not a directory (train "
                        f"one with `jaxrl-reason reward-model`)")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
            or not math.isfinite(weight):
        problems.append(f"rewards.reward_model_weight: must be a finite number, got {weight!r}")
    elif weight != 0 and not directory:
        problems.append("rewards.reward_model_weight: a nonzero weight needs "
                        "rewards.reward_model_dir (the reward model to score with)")
    if not isinstance(_get(config, "rewards.reward_model_normalize", False), bool):
        problems.append("rewards.reward_model_normalize: must be True or False")
    return problems


def check_config(config: ml_collections.ConfigDict, num_devices: int) -> None:
    """Raises ConfigError listing every problem of `config` (see `validate_config`)."""
    problems = validate_config(config, num_devices)
    if problems:
        raise ConfigError(problems)
