"""`jaxrl-reason plan`'s context-parallelism search (`plan.plan(choose_context=True)`):
when a packed config's training passes do not fit, the same config with its packs' sequence
over 2, 4, ... chips (`with_context`), the smallest size that fits, and what to run it with.

  with_context       the config at context size cp (chips from fsdp, then data)
  choose_context     the search, given a compile function
  context_overrides  the --config. overrides of the chosen config
  context_lines      the report's table of the sizes tried
"""

from __future__ import annotations

import math
from typing import Any

import ml_collections

from jaxrl_reason.runtime import sharding as shd

GiB = 2**30

TRAINING = ("log-prob pass", "update")  # the programs whose sequence the context axis shards


def fits(report: dict[str, Any], names: tuple[str, ...] | None = None) -> bool:
    """Whether every program of `report` (or those of `names`) fits the chip's HBM."""
    return all(p.total_bytes <= report["chip"].hbm_bytes for p in report["programs"]
               if names is None or p.name in names)


def mesh_sizes(config, n_dev: int) -> dict[str, int]:
    """{axis: size} of the config's mesh on `n_dev` devices (MESH_AXES order)."""
    return dict(zip(shd.MESH_AXES, shd.resolve_mesh_shape(dict(config.mesh), n_dev)))


def with_context(config: ml_collections.ConfigDict, cp: int,
                 n_dev: int) -> ml_collections.ConfigDict | None:
    """`config` with its packs' sequence sharded over `cp` chips (`mesh.context = cp`), or
    None when the mesh cannot give them or the config does not pack (context parallelism
    splits packs: `rl.packing`, as config validation requires).

    The chips come from `mesh.fsdp`, then `mesh.data` (the number of devices is fixed):
    the data-parallel size shrinks by the factor the context grows and rl.micro_batches
    grows by it, so a micro-batch holds the same packs per data-parallel shard as before,
    each now split over the context chips (its activations per chip divided by that
    factor); the weights stay sharded over as many chips (the "embed" rule's fsdp axis
    becomes fsdp x context) and the "length" rule is ("length", "context").
    """
    if "context" not in shd.MESH_AXES or not config.rl.get("packing", False):
        return None
    sizes = mesh_sizes(config, n_dev)
    if cp % sizes["context"]:
        return None
    factor = cp // sizes["context"]
    take_fsdp = math.gcd(sizes["fsdp"], factor)
    take_data = factor // take_fsdp
    if sizes["data"] % take_data:
        return None
    sizes.update(fsdp=sizes["fsdp"] // take_fsdp, data=sizes["data"] // take_data, context=cp)
    out = ml_collections.ConfigDict(config.to_dict())
    out.mesh = ml_collections.ConfigDict(sizes)
    out.rl.micro_batches = int(config.rl.get("micro_batches", 1)) * factor
    rules = [(name, tuple(a) if isinstance(a, (list, tuple)) else a)
             for name, a in config.sharding_rules]
    rules = [(name, ("fsdp", "context") if (name, axes) == ("embed", "fsdp") else axes)
             for name, axes in rules if name != "length"]
    out.sharding_rules = tuple(rules + [("length", "context")])
    return out


def memory_record(config, report) -> dict[str, Any]:
    """What the context search keeps of one compile: the mesh, micro-batches and, per
    program, argument / temporary / total bytes per chip."""
    return {"context": report["mesh"].get("context", 1), "mesh": dict(report["mesh"]),
            "micro_batches": int(config.rl.get("micro_batches", 1)),
            "fits": fits(report, TRAINING),
            "programs": {p.name: {"argument_bytes": p.argument_bytes,
                                  "temp_bytes": p.temp_bytes, "total_bytes": p.total_bytes}
                         for p in report["programs"]}}


def choose_context(config, report, training, context, sweep, compile_fn):
    """(config, report, context) at the smallest context size whose `training` programs
    fit, when they do not fit as configured (`report`: theirs at that size); `sweep` sizes
    are compiled for the record too."""
    n_dev = report["devices"]
    if (fits(report) and not sweep) or not context["axis"]:
        return config, report, context
    best = None if not fits(report) else (config, report)
    cp = context["chosen"]
    while True:
        cp *= 2
        if best is not None and cp > max(sweep, default=0):
            break
        candidate = with_context(config, cp, n_dev) if cp <= n_dev else None
        if candidate is None:
            break
        small = compile_fn(candidate, training)
        context["tried"].append(memory_record(candidate, small))
        if best is None and fits(small):
            best = (candidate, small)
    if best is None:
        largest = context["tried"][-1]["context"]
        context["reason"] = (
            "the training passes do not fit, and context parallelism splits packs only: "
            "set rl.packing=True to try it" if largest == 1 and not config.rl.get("packing")
            else f"the training passes fit at no context size up to {largest}")
        return config, report, context
    chosen, small = best
    if chosen is config:
        return config, report, context
    cp = small["mesh"]["context"]
    first = context["tried"][0]["programs"]
    context.update(chosen=cp, overrides=context_overrides(config, chosen),
                   reason="the training passes do not fit at context 1 (" + ", ".join(
                       f"{name} {first[name]['total_bytes'] / GiB:.1f} GiB" for name in training
                       if name in first) + f" per chip); context {cp} is the smallest size "
                   "that fits")
    return chosen, small, context


def context_overrides(config, chosen) -> list[str]:
    """The `--config.` overrides that turn `config` into `chosen` (`with_context`'s): every
    mesh axis, rl.micro_batches when it changed, and sharding_rules when they changed."""
    out = [f"mesh.{k}={v}" for k, v in chosen.mesh.items()]
    if chosen.rl.micro_batches != config.rl.get("micro_batches", 1):
        out.append(f"rl.micro_batches={chosen.rl.micro_batches}")
    rules = lambda c: tuple((n, tuple(a) if isinstance(a, (list, tuple)) else a)  # noqa: E731
                            for n, a in c.sharding_rules)
    if rules(chosen) != rules(config):
        out.append(f"sharding_rules='{rules(chosen)!r}'")
    return out


def context_lines(report: dict[str, Any]) -> list[str]:
    """The context sizes the plan compiled the training passes at, and their memory."""
    tried = (report.get("context") or {}).get("tried", [])
    if len(tried) < 2:
        return []
    names = [n for n in TRAINING if n in tried[0]["programs"]]
    lines = ["", f"context parallelism (mesh.context): chose {report['context']['chosen']}; "
                 "per chip, GiB, temporaries / total:", "",
             "| context | mesh | micro-batches | " + " | ".join(names) + " | fits |",
             "|---|---|---|" + "---|" * len(names) + "---|"]
    for t in tried:
        cells = " | ".join(f"{t['programs'][n]['temp_bytes'] / GiB:.2f} / "
                           f"{t['programs'][n]['total_bytes'] / GiB:.2f}" for n in names)
        lines.append(f"| {t['context']} | {t['mesh']} | {t['micro_batches']} | {cells} | "
                     f"{'yes' if t['fits'] else 'NO'} |")
    return lines
