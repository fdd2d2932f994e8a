"""Sizing a run for a TPU slice without one: ahead-of-time compilation for a real topology.

    jaxrl-reason plan --config configs/arith_grpo.py --topology v5e:2x4

With libtpu installed (`pip install 'jaxrl-reason[tpu]'`) JAX describes a TPU slice's devices
on any machine (`jax.experimental.topologies.get_topology_desc`). `plan` builds the config's
mesh over those devices and lowers, with `jax.ShapeDtypeStruct` inputs carrying their
`NamedSharding`s (nothing is allocated), the three programs of an RL step: the sampler, the
log-prob pass (reference / old policy) and the training update; it compiles each for the
slice and reads XLA's own `memory_analysis()` and `cost_analysis()`.

Reported per device: argument, output-only and temporary bytes, their total against the
chip's HBM, FLOPs and HBM bytes of one call, the roofline time max(FLOPs / peak, bytes /
bandwidth) and the model FLOP utilization that time implies (model FLOPs: 2 |theta| per token
forward, 6 |theta| forward + backward, over the whole slice). XLA's cost analysis counts a
`while` loop's body once, so the sampler's FLOPs and bytes are the analytic per-token count
times the number of decoded tokens (noted in the output). For the same reason, with
`model.scan_layers` the log-prob pass's and update's FLOPs and bytes come from two extra
compiles of the same programs with 1 and 2 unrolled layers (cost = base + n_layers x one
layer, both read off XLA), while their memory is the full-depth scanned compile's.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.kernels import platform as kernel_platform
from jaxrl_reason.models.params import abstract_params, param_shardings
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.runtime.reliability import tree_bytes
from jaxrl_reason.runtime import plan_context
from jaxrl_reason.runtime.plan_context import (  # noqa: F401 (re-exported)
    TRAINING, context_lines, context_overrides, fits, memory_record, mesh_sizes, with_context)
from jaxrl_reason.runtime.plan_sampler import (  # noqa: F401 (re-exported)
    kv_bytes_per_position, long_tail_plan, format_long_tail, model_params, refill_schedule,
    sampler_time, stage_width)
from jaxrl_reason.runtime.build import hf_model_config, model_config
from jaxrl_reason.rl.packing import packer_for
from jaxrl_reason.rl.update import (PACK_KEYS, make_logprob_fn, make_packed_logprob_fn,
                                    make_update_fn)
from jaxrl_reason.sampling.sampler import Sampler
from jaxrl_reason.runtime.train_state import (TrainState, learning_rate_schedule, make_optimizer,
                                      opt_state_shardings, trainable_params)

GiB = 2**30
PROGRAMS = ("sampler", "log-prob pass", "update")  # the programs of one RL step


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published per-chip figures (bf16 dense peak, HBM capacity and bandwidth)."""
    name: str
    hbm_bytes: float
    peak_flops: float      # bf16 FLOP/s
    hbm_bandwidth: float   # bytes/s


# Google Cloud TPU documentation, system architecture pages (per chip).
CHIPS = {
    "v4": Chip("TPU v4", 32 * GiB, 275e12, 1.2e12),
    "v5e": Chip("TPU v5e", 16 * GiB, 197e12, 819e9),
    "v5p": Chip("TPU v5p", 95 * GiB, 459e12, 2.765e12),
    "v6e": Chip("TPU v6e", 32 * GiB, 918e12, 1.64e12),
}


@dataclasses.dataclass
class ProgramPlan:
    """Per-device figures of one compiled program."""
    name: str
    argument_bytes: float
    output_bytes: float
    temp_bytes: float
    flops: float
    hbm_bytes: float
    model_flops: float      # over the whole slice, for MFU
    note: str = ""
    mosaic_calls: int = 0   # Pallas kernels compiled by Mosaic (tpu_custom_call) in the HLO
    resident_bytes: float = 0.0  # long-lived arrays on the chip that are not arguments here
                                 # (optimizer state while sampling, the reference params)

    @property
    def total_bytes(self) -> float:
        return self.argument_bytes + self.output_bytes + self.temp_bytes + self.resident_bytes

    def roofline_s(self, chip: Chip) -> float:
        return max(self.flops / chip.peak_flops, self.hbm_bytes / chip.hbm_bandwidth)

    def mfu(self, chip: Chip, num_devices: int) -> float:
        t = self.roofline_s(chip)
        return self.model_flops / (t * chip.peak_flops * num_devices) if t > 0 else 0.0


def topology_devices(topology: str) -> tuple[Chip, list]:
    """(chip, devices) of a TPU topology name such as "v5e:2x4"; errors name what is wrong."""
    kind = topology.split(":", 1)[0]
    if kind not in CHIPS:
        raise ValueError(f"unknown TPU generation {kind!r} in --topology {topology!r}; known: "
                         f"{sorted(CHIPS)} (e.g. v5e:2x4, v5p:2x2x1, v6e:2x4)")
    # Compiling ahead of time needs no chip, so a training process on this host that holds
    # libtpu's lockfile must not stop it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise ValueError("plan needs libtpu to describe a TPU slice: pip install "
                         "'jaxrl-reason[tpu]' (works on a CPU machine)") from None
    from jax.experimental import topologies
    # One chip (e.g. "v5e:1x1", a v5litepod-1 host): libtpu's default host bounds are a
    # 4-chip host, which a 1-chip topology does not divide.
    single = re.fullmatch(r"[a-z0-9]+:1(x1)*", topology) is not None
    try:
        desc = topologies.get_topology_desc(
            platform="tpu", topology_name=topology,
            **({"chips_per_host_bounds": (1, 1, 1)} if single else {}))
    except Exception as e:
        raise ValueError(f"--topology {topology!r}: {e}") from None
    return CHIPS[kind], list(desc.devices)


def _sds(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _memory_and_cost(compiled) -> tuple[Any, dict]:
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return mem, dict(cost or {})


def _arg_bytes(args) -> float:
    """Per-device bytes of the (sharded) ShapeDtypeStruct leaves of `args` (PRNG keys: 8)."""
    total = 0.0
    for x in jax.tree.leaves(args):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        key = jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        total += math.prod(shape) * (8 if key else x.dtype.itemsize)
    return total


_OOM = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT])\)")


def _compile(name, lowered, args, model_flops, n_dev, note="", flops=None,
             hbm=None) -> ProgramPlan:
    """Compiles `lowered`; a program that XLA refuses for lack of HBM is reported with the
    temporaries XLA says it needs (no cost analysis then: FLOPs estimated from the model)."""
    try:
        compiled = lowered.compile()
    except Exception as e:  # jax.errors.JaxRuntimeError
        m = _OOM.search(str(e))
        if "RESOURCE_EXHAUSTED" not in str(e) or not m:
            raise
        temps = float(m.group(1)) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[m.group(2)]
        return ProgramPlan(name=name, argument_bytes=_arg_bytes(args), output_bytes=0.0,
                           temp_bytes=temps, flops=model_flops / n_dev if flops is None
                           else flops, hbm_bytes=0.0 if hbm is None else hbm,
                           model_flops=model_flops,
                           note="XLA could not fit it in HBM (temporaries from its error); "
                                "FLOPs are the model estimate")
    return _program(name, compiled, model_flops, note, flops, hbm)


def _program(name, compiled, model_flops, note="", flops=None, hbm=None) -> ProgramPlan:
    mem, cost = _memory_and_cost(compiled)
    return ProgramPlan(
        name=name, argument_bytes=float(mem.argument_size_in_bytes),
        output_bytes=float(mem.output_size_in_bytes - mem.alias_size_in_bytes),
        temp_bytes=float(mem.temp_size_in_bytes),
        flops=float(cost.get("flops", 0.0)) if flops is None else flops,
        hbm_bytes=float(cost.get("bytes accessed", 0.0)) if hbm is None else hbm,
        model_flops=model_flops, note=note,
        mosaic_calls=compiled.as_text().count('custom_call_target="tpu_custom_call"'))


def plan(config: ml_collections.ConfigDict, topology: str,
         programs: tuple[str, ...] = PROGRAMS, layer_cost: bool = True,
         choose_context: bool = True, context_sweep: tuple[int, ...] = (),
         kv_budget_bytes: float | None = None) -> dict[str, Any]:
    """Compiles the config's sampler, log-prob pass and RL update (or those of `programs`
    named) for `topology`.

    Traced for TPU (`kernels.platform.target`): `kernels.backend` / `model.logprobs_impl`
    "auto" choose what a TPU run would (the Pallas kernels, compiled by Mosaic, per device
    under `shard_map`; chunked log-probs), not what this CPU host would.
    `layer_cost=False` skips the 1- and 2-layer compiles of scanned layers: memory is the
    same, FLOPs fall back to the model's count (`with_flops_floor`), and HBM bytes count the
    scanned layer once (the report says so in `layer_cost`).
    `choose_context`: when the training passes (log-prob pass, update) do not fit, and the
    mesh has a "context" axis, the sequence is sharded over 2, 4, ... chips (`with_context`)
    and the smallest size that fits is chosen (`report["context"]`); `context_sweep` names
    further sizes compiled for the record (their memory in `report["context"]["tried"]`).
    With `rl.max_num_seqs` > 0 the report carries the sampler's time on long-tailed lengths,
    static beside slot refill (`report["long_tail"]`, `plan_sampler.long_tail_plan`) under
    `kv_budget_bytes` per chip (default: the HBM left beside the sampler's arrays).
    Returns {"chip", "devices", "mesh", "params", "programs": [ProgramPlan], "layer_cost",
    "context", "long_tail" (or None)}.
    """
    if config.get("hf_model"):  # plan the directory's architecture (config.json only)
        resolved = ml_collections.ConfigDict(config.to_dict())
        resolved.model = ml_collections.ConfigDict(
            dataclasses.asdict(hf_model_config(config, 0)))
        resolved.hf_model = ""
        config = resolved
    with kernel_platform.target("tpu"):
        # The training passes first: the context size they need sets the mesh the other
        # programs (the sampler) are compiled on.
        training = tuple(p for p in programs if p in TRAINING) if choose_context else ()
        report = _plan(config, topology, training or programs)
        context = {"chosen": mesh_sizes(config, report["devices"]).get("context", 1),
                   "axis": "context" in shd.MESH_AXES, "reason": "",
                   "tried": [memory_record(config, report)]}
        if training:
            config, report, context = plan_context.choose_context(
                config, report, training, context, tuple(context_sweep),
                lambda c, names: _plan(c, topology, names))
            others = tuple(p for p in programs if p not in TRAINING)
            done = {p.name: p for p in report["programs"]}
            if others:
                done.update((p.name, p) for p in _plan(config, topology, others)["programs"])
            report = dict(report, programs=[done[p] for p in programs])
        scanned = config.model.get("scan_layers") and config.model.n_layers > 1
        if scanned and layer_cost:
            report = _with_unrolled_layer_cost(config, topology, report, programs)
        return {**report, "layer_cost": bool(layer_cost or not scanned), "context": context,
                "long_tail": _long_tail(config, report, kv_budget_bytes)}


def _long_tail(config, report, kv_budget_bytes):
    """The sampler's time on long-tailed lengths when `rl.max_num_seqs` > 0, else None."""
    slots = int(config.rl.get("max_num_seqs", 0))
    sampler = next((p for p in report["programs"] if p.name == "sampler"), None)
    if slots <= 0 or sampler is None:
        return None
    cfg = model_config(config.model, config.model.vocab_size or config.tokenizer.vocab_size)
    rl = config.rl
    return long_tail_plan(
        cfg, rows=rl.batch_prompts * rl.num_generations, max_new_tokens=rl.max_new_tokens,
        prompt_len=max(config.task.prompt_buckets), num_prompts=rl.batch_prompts,
        slots=slots, refill_every=int(rl.get("refill_every", 8)), chip=report["chip"],
        n_dev=report["devices"], weight_bytes_per_chip=sampler.argument_bytes,
        other_bytes_per_chip=sampler.resident_bytes, kv_budget_bytes=kv_budget_bytes)


def _with_unrolled_layer_cost(config, topology, report, programs=PROGRAMS):
    """`report` with the log-prob pass's and update's FLOPs/bytes extrapolated from 1- and
    2-layer unrolled compiles: XLA counts the scanned layer loop's body once."""
    layers = int(config.model.n_layers)
    costs = []
    for n in (1, 2):
        small = ml_collections.ConfigDict(config.to_dict())
        small.model.n_layers, small.model.scan_layers = n, False
        wanted = tuple(p for p in ("log-prob pass", "update") if p in programs)
        costs.append({p.name: p for p in _plan(small, topology, wanted)["programs"]})
    programs = []
    for prog in report["programs"]:
        if prog.name in costs[0]:
            one, two = costs[0][prog.name], costs[1][prog.name]
            note = (f"FLOPs/bytes from 1- and 2-layer unrolled compiles (XLA counts the "
                    f"scanned {layers}-layer loop once)" + (f"; {one.note}" if one.note else ""))
            prog = dataclasses.replace(
                prog, flops=one.flops + (layers - 1) * (two.flops - one.flops),
                hbm_bytes=one.hbm_bytes + (layers - 1) * (two.hbm_bytes - one.hbm_bytes),
                note=note)
        programs.append(prog)
    return dict(report, programs=programs)


def _sampler_program(cfg, model, params, mesh, rules, p, g, tp, length, n_dev,
                     max_num_seqs: int = 0, refill_every: int = 8) -> ProgramPlan:
    """The sampler: prefill p prompts of tp tokens, decode `length` tokens for p * g rows
    (with `max_num_seqs` > 0: in that many slots with refill, as `rl.max_num_seqs`).
    FLOPs and bytes are analytic (XLA counts the decode loop's body once)."""
    n, rep = p * g, shd.replicated(mesh)
    rules = shd.sampling_rules(rules, mesh)  # as the run's sampler: rows over context too
    sampler = Sampler(model, eos_id=2, pad_id=0, mesh=mesh, rules=rules,
                      max_num_seqs=max_num_seqs, refill_every=refill_every)
    prompt_sharding = (shd.batch_sharding(mesh, rules, 2, p)
                       if p % shd.data_parallel_size(mesh, rules) == 0 else rep)
    key = jax.eval_shape(lambda: jax.random.key(0))
    lowered = sampler.lower(
        params, _sds((p, tp), jnp.int32, prompt_sharding), _sds((p, tp), bool, prompt_sharding),
        _sds(key.shape, key.dtype, rep), temperature=_sds((), jnp.float32, rep),
        top_p=_sds((), jnp.float32, rep), top_k=_sds((), jnp.int32, rep), num_samples=g,
        max_new_tokens=length)
    num_params = model_params(cfg)
    per_token = 2 * num_params + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * (tp + length)
    decode_flops = per_token * (p * tp + n * length)
    return _compile(
        "sampler", lowered, params, decode_flops, n_dev,
        note="FLOPs/bytes analytic (XLA counts the decode loop body once): weights read "
             "once per decoded token",
        flops=decode_flops / n_dev, hbm=tree_bytes(params) / n_dev * (length + 1))


def with_flops_floor(prog: ProgramPlan, n_dev: int, remat: str) -> ProgramPlan:
    """`prog` with at least the FLOPs the model must compute per device.

    XLA counts the attention-chunk and log-prob-chunk loops' bodies once, so its FLOPs can
    fall below the step's real work; the roofline never uses less than the model's count
    (x 8/6 for the update with remat: the forward runs twice). The sampler is analytic.
    """
    if prog.name == "sampler":
        return prog
    factor = 8 / 6 if prog.name == "update" and remat != "none" else 1.0
    floor = prog.model_flops / n_dev * factor
    if prog.flops >= floor:
        return prog
    return dataclasses.replace(prog, flops=floor, note=(prog.note + "; " if prog.note else "")
                               + "FLOPs: the model's count (XLA counts chunk loops once and "
                               "gave less)")


def _plan(config: ml_collections.ConfigDict, topology: str,
          programs: tuple[str, ...] = PROGRAMS) -> dict[str, Any]:
    wanted = programs
    chip, devices = topology_devices(topology)
    mesh = shd.make_mesh(dict(config.mesh), devices)
    rules = tuple((n, tuple(a) if isinstance(a, (list, tuple)) else a)
                  for n, a in config.sharding_rules)
    cfg = model_config(config.model, config.model.vocab_size or config.tokenizer.vocab_size)
    model = Transformer(cfg)
    rl = config.rl
    shardings = param_shardings(cfg, mesh, rules)
    params = jax.tree.map(lambda x, s: _sds(x.shape, x.dtype, s), abstract_params(cfg),
                          shardings)
    num_params = model_params(cfg)
    p, g = rl.batch_prompts, rl.num_generations
    n, tp, length = p * g, max(config.task.prompt_buckets), rl.max_new_tokens
    batch_sharding = lambda ndim: shd.batch_sharding(mesh, rules, ndim, n)  # noqa: E731
    rep = shd.replicated(mesh)
    programs = []

    # 1. Sampler: prefill P prompts, decode L tokens for N rows.
    n_dev = len(devices)
    if "sampler" in wanted:
        programs.append(_sampler_program(cfg, model, params, mesh, rules, p, g, tp, length,
                                         n_dev, int(rl.get("max_num_seqs", 0)),
                                         int(rl.get("refill_every", 8))))

    # 2. Log-prob pass (reference / old policy) over the N rows.
    rollout = (_sds((n, tp), jnp.int32, batch_sharding(2)), _sds((n, tp), bool, batch_sharding(2)),
               _sds((n, length), jnp.int32, batch_sharding(2)),
               _sds((n, length), jnp.float32, batch_sharding(2)))
    packs, share, tokens, per_micro = _packs(config, cfg, mesh, rules, n, length)
    if "log-prob pass" in wanted:
        if packs is None:
            logprob = make_logprob_fn(model, rl.temperature, rl.micro_batches, mesh, rules)
            lowered, args = logprob.lower(params, *rollout), (params, rollout)
        else:
            logprob = make_packed_logprob_fn(model, rl.temperature, share, mesh, rules,
                                             per_micro)
            lowered, args = logprob.lower(params, packs), (params, packs)
        programs.append(_compile("log-prob pass", lowered, args, 2 * num_params * tokens,
                                 n_dev))

    # 3. The update: forward + backward + AdamW on all N rows.
    optimizer = make_optimizer(learning_rate_schedule(rl.learning_rate, rl.warmup_steps,
                                                      rl.steps, rl.lr_decay),
                               weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm)
    trainable = trainable_params(params)  # LoRA: Adam state for the adapters only
    opt_state = jax.tree.map(lambda x, s: _sds(x.shape, x.dtype, s),
                             jax.eval_shape(optimizer.init, trainable),
                             opt_state_shardings(optimizer, trainable))
    state = TrainState(step=_sds((), jnp.int32, rep), params=params, opt_state=opt_state)
    batch = dict(zip(("prompt_tokens", "prompt_valid", "completion_tokens", "mask"), rollout))
    if packs is not None:  # the packed update reads packs, not the prompt and completion rows
        batch = dict(packs, mask=batch["mask"])
    batch.update(advantages=_sds((n,), jnp.float32, batch_sharding(1)),
                 num_sequences=_sds((), jnp.float32, rep), num_tokens=_sds((), jnp.float32, rep),
                 beta=_sds((), jnp.float32, rep),
                 sampler_logp=_sds((n, length), jnp.float32, batch_sharding(2)))
    if rl.beta > 0:
        batch["ref_logp"] = _sds((n, length), jnp.float32, batch_sharding(2))
    if rl.num_iterations > 1:
        batch["old_logp"] = _sds((n, length), jnp.float32, batch_sharding(2))
    update = make_update_fn(model, optimizer, rl, mesh, rules,
                            kernel_backend=config.kernels.backend, packed=packs is not None,
                            share_prompts=share, packs_per_micro=per_micro)
    if "update" in wanted:
        # Forward 2|theta|, input gradients 2|theta|, weight gradients 2|theta| (not LoRA's).
        per_token = (4 if cfg.lora is not None else 6) * num_params
        programs.append(_compile("update", update.lower(state, batch), (state, batch),
                                 per_token * tokens, n_dev))

    # What else lives on the chip while each program runs; the micro-batch loops' cost.
    # With rl.offload_optimizer / rl.offload_reference those wait in host memory instead.
    # LoRA's reference is the policy's own base: no second copy.
    opt_bytes = _arg_bytes(opt_state)
    ref_bytes = _arg_bytes(params) if rl.beta > 0 and cfg.lora is None else 0.0
    opt_out = 0.0 if rl.get("offload_optimizer", False) else opt_bytes
    ref_out = 0.0 if rl.get("offload_reference", False) else ref_bytes
    # During the reference pass the reference is the argument and the policy stays resident.
    resident = {"sampler": opt_out + ref_out, "log-prob pass": opt_out + ref_bytes,
                "update": ref_out}
    k = (int(rl.micro_batches) if packs is None or per_micro is None
         else packs["pack_tokens"].shape[0] // per_micro)  # the micro-batches run
    for i, prog in enumerate(programs):
        changes = {"resident_bytes": resident[prog.name]}
        if k > 1 and prog.name != "sampler" and not prog.note:
            changes.update(flops=prog.flops * k, hbm_bytes=prog.hbm_bytes * k,
                           note=f"XLA counts the {k}-micro-batch loop body once: FLOPs and "
                                f"bytes x{k} (an upper bound: the optimizer's share is "
                                f"counted {k} times)")
        programs[i] = dataclasses.replace(prog, **changes)
    programs = [with_flops_floor(prog, n_dev, cfg.remat) for prog in programs]
    return {"chip": chip, "devices": n_dev, "mesh": dict(mesh.shape), "params": num_params,
            "programs": programs, "topology": topology}


def _packs(config, cfg, mesh, rules, n: int, length: int):
    """With `rl.packing`: (the packed passes' inputs, `ShapeDtypeStruct`s pack_* int32
    [K, T] and pack_index int32 [N, L], at the run's largest pack count K, which holds every
    row at full length; whether packs share prompts; K x T tokens; the packs of a
    micro-batch, `Packer.packs_per_micro`). Without: (None, True, the N padded rows'
    tokens, None)."""
    tp = max(config.task.prompt_buckets)
    if not config.rl.get("packing", False):
        return None, True, n * (tp + length), None
    packer = packer_for(config, cfg, shd.data_parallel_size(mesh, rules))
    k, t = packer.counts.ladder[-1], packer.pack_tokens  # the top rung: any batch fits
    sharded = lambda rows: shd.batch_sharding(mesh, rules, 2, rows)  # noqa: E731
    packs = {key: _sds((k, t), jnp.int32, sharded(k)) for key in PACK_KEYS[:-1]}
    packs["pack_index"] = _sds((n, length), jnp.int32, sharded(n))
    return packs, packer.share_prompts, k * t, packer.packs_per_micro


def advice(report: dict[str, Any]) -> list[str]:
    """What would help a program that does not fit."""
    chip, out = report["chip"], []
    context = report.get("context") or {}
    if context.get("reason"):
        changes = " ".join(f"--config.{o}" for o in context.get("overrides", ()))
        out.append(f"context parallelism: {context['reason']}"
                   + (f"; run with {changes}" if context["chosen"] > 1 else ""))
    for prog in report["programs"]:
        if prog.total_bytes <= chip.hbm_bytes:
            continue
        over = prog.total_bytes / chip.hbm_bytes
        if prog.resident_bytes > 0 and prog.total_bytes - prog.resident_bytes <= chip.hbm_bytes:
            out.append(f"{prog.name} fits without the arrays it does not read: keep them in "
                       "host memory (rl.offload_reference, rl.offload_optimizer)")
        elif prog.name == "sampler":
            out.append(f"sampler needs {over:.1f}x the HBM: shard the KV cache over more "
                       "devices (mesh.fsdp / mesh.tensor), fewer rows per call "
                       "(rl.batch_prompts), or a bf16 KV cache")
        elif prog.temp_bytes > prog.argument_bytes:
            out.append(f"{prog.name} needs {over:.1f}x the HBM, mostly temporaries: fewer "
                       "rows per update (micro-batches), rematerialization, or a shorter "
                       "rl.max_new_tokens")
        else:
            out.append(f"{prog.name} needs {over:.1f}x the HBM, mostly weights and optimizer "
                       "state: shard them over more devices (mesh.fsdp)")
    return out


def format_report(report: dict[str, Any]) -> str:
    """The printed plan: one row per program, then the verdict and advice."""
    chip, n_dev = report["chip"], report["devices"]
    lines = [f"plan for {report['topology']} ({chip.name}: {n_dev} chips, "
             f"{chip.hbm_bytes / GiB:.0f} GiB HBM, {chip.peak_flops / 1e12:.0f} TFLOP/s bf16, "
             f"{chip.hbm_bandwidth / 1e9:.0f} GB/s each); mesh {report['mesh']}; "
             f"{report['params']:,} params", "",
             "| program | args GiB | outputs GiB | temps GiB | other resident GiB | "
             "total GiB / HBM | GFLOP | GB | roofline ms | MFU |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in report["programs"]:
        lines.append(
            f"| {p.name} | {p.argument_bytes / GiB:.3f} | {p.output_bytes / GiB:.3f} | "
            f"{p.temp_bytes / GiB:.3f} | {p.resident_bytes / GiB:.3f} | "
            f"{p.total_bytes / GiB:.3f} / {chip.hbm_bytes / GiB:.0f}"
            f"{'' if p.total_bytes <= chip.hbm_bytes else ' (does not fit)'} | "
            f"{p.flops / 1e9:.2f} | {p.hbm_bytes / 1e9:.3f} | {1e3 * p.roofline_s(chip):.3f} | "
            f"{100 * p.mfu(chip, n_dev):.1f}% |")
    notes = [f"- {p.name}: {p.note}" for p in report["programs"] if p.note]
    notes.append("- other resident: arrays that stay on the chip while the program runs "
                 "(optimizer state during sampling and scoring; the reference params when "
                 "rl.beta > 0), unless rl.offload_optimizer / rl.offload_reference keep them "
                 "in host memory")
    lines += ["", *notes, *context_lines(report), "",
              "fits: yes" if fits(report) else "fits: NO"]
    lines += [f"- {a}" for a in advice(report)]
    if report.get("long_tail"):
        lines += ["", format_long_tail(report["long_tail"])]
    return "\n".join(lines)
