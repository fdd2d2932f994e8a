"""Phase checkpoints of a run: what is saved, where, and how params come back for eval/sampling.

Layout under the workdir:
    tokenizer.model            the run's tokenizer (also inside every checkpoint's metadata)
    checkpoints/sft/<step>/    cold-start SFT phase
    checkpoints/rl/<step>/     RL phase

A checkpoint's state is {"train_state": {step, params, opt_state}, **extra} (extra: RNG key
data, reference params, ...) and its JSON metadata holds the phase, the data-iterator state,
the model config, the tokenizer and the run config, so a checkpoint directory alone is
enough to sample from it.

Multi-host: every process calls `save` / `restore_latest` / `load_params` (orbax writes each
array shard from the process that holds it; process 0 writes the JSON files and manifests,
see `checkpointing`); the workdir must be storage that every process sees (a shared file
system or gs://...).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import jax

from jaxrl_reason.runtime import paths
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.checkpoints.manifest import abstract_like
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models import lora as lora_lib, lora_params
from jaxrl_reason.models.params import abstract_params, init_params, param_shardings, to_layout
from jaxrl_reason.runtime.sharding import put_replicated, replicated
from jaxrl_reason.tokenizers import tokenizer_from_serialized
from jaxrl_reason.runtime.train_state import TrainState, trainable_params

PHASES = ("sft", "rl")


def phase_dir(workdir: str, phase: str) -> str:
    """<workdir>/checkpoints/<phase>."""
    return os.path.join(workdir, "checkpoints", phase)


def _state_tree(state: TrainState, extra: dict | None) -> dict:
    # LoRA: only the adapters (the trainable leaves) and their optimizer state are saved;
    # the metadata's "lora_base" names the frozen base and fingerprints it.
    tree = {"train_state": {"step": state.step, "params": trainable_params(state.params),
                            "opt_state": state.opt_state}}
    tree.update(extra or {})
    return tree


def _global_leaves(tree: dict, mesh) -> dict:
    """On multi-host, single-device leaves (the RNG key data of a fresh run, made on each
    process's first device) become mesh-replicated global arrays, so that orbax sees one
    array with one writer instead of a local copy per process. One process: unchanged."""
    if jax.process_count() == 1:
        return tree

    def one(x):
        if isinstance(x, jax.Array) and isinstance(x.sharding, jax.sharding.SingleDeviceSharding):
            return put_replicated(mesh, jax.device_get(x))
        return x

    return jax.tree.map(one, tree)


def _on_mesh(x: jax.ShapeDtypeStruct, mesh) -> jax.ShapeDtypeStruct:
    """Restore target of one leaf: single-device leaves (the step counter, RNG key data,
    created uncommitted) come back replicated on `mesh`, since a restored array is committed
    and a committed one-device array cannot enter a jit together with mesh-sharded params."""
    if isinstance(x.sharding, jax.sharding.SingleDeviceSharding):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated(mesh))
    return x


class PhaseCheckpointer:
    """Saves/restores one phase's TrainState (+ extra arrays) with run metadata."""

    def __init__(self, rt, phase: str, base_checkpoint: str | None = None):
        """`base_checkpoint`: where a LoRA phase's frozen base was loaded from, if not the
        run's hf_model or its own SFT phase (see `lora_base`)."""
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        self.rt, self.phase = rt, phase
        self.restored_step: int | None = None
        self.ckpt = Checkpointer(phase_dir(rt.workdir, phase),
                                 max_to_keep=rt.config.checkpoint.max_to_keep)
        self._lora_base: dict | None = None
        self.base_checkpoint = base_checkpoint

    def lora_base(self, params) -> dict | None:
        """Metadata naming the frozen base of LoRA `params` (None without adapters): where
        it comes from (`base_checkpoint`, the run's hf_model, its SFT checkpoint, or the
        seed's random init)
        and its `lora_params.base_fingerprint`, computed once (the base is frozen)."""
        if not lora_lib.has_adapters(params):
            return None
        if self._lora_base is None:
            config = self.rt.config
            if self.base_checkpoint:
                source = {"kind": "checkpoint", "path": self.base_checkpoint}
            elif config.get("hf_model"):
                source = {"kind": "hf", "path": config.hf_model}
            elif self.phase == "rl":
                source = {"kind": "checkpoint", "path": phase_dir(self.rt.workdir, "sft")}
            else:
                source = {"kind": "init", "seed": int(config.seed)}
            self._lora_base = {**source, "fingerprint": lora_params.base_fingerprint(params)}
        return self._lora_base

    def metadata(self, data_state: Any, extra_meta: dict | None = None) -> dict:
        return {
            "phase": self.phase,
            "data_iterator": data_state,
            "model_config": dataclasses.asdict(self.rt.model_cfg),
            "tokenizer": self.rt.tokenizer.serialized,
            "config": self.rt.config.to_json_best_effort(),
            **(extra_meta or {}),
        }

    def save(self, step: int, state: TrainState, data_state: Any, *,
             extra: dict | None = None, extra_meta: dict | None = None) -> None:
        """Saves `state` (+ `extra` arrays) as `step` and waits until it is complete."""
        tree = _global_leaves(_state_tree(state, extra), self.rt.mesh)
        base = self.lora_base(state.params)
        extra_meta = {**(extra_meta or {}), **({"lora_base": base} if base else {})}
        self.ckpt.save(step, tree, self.metadata(data_state, extra_meta), force=True)
        self.ckpt.wait_until_finished()

    def restore_latest(self, template: TrainState, extra: dict | None = None):
        """(state, metadata[, extra]) from the newest complete step that is not damaged, or
        None if there is no complete step.

        `template` (and `extra`) give the structure, shapes and target shardings. Damaged
        newer steps are skipped (and reported); `restored_step` is the step used. Raises
        CheckpointCorruptError (a ValueError) when every complete step is damaged.
        """
        if self.ckpt.latest_step() is None:
            return None
        target = jax.tree.map(lambda x: _on_mesh(x, self.rt.mesh),
                              abstract_like(_state_tree(template, extra)))
        tree, meta = self.ckpt.restore(abstract_state=target)
        self.restored_step = self.ckpt.last_restored_step
        report_fallback(self.ckpt, f"resuming {self.phase}")
        ts = tree.pop("train_state")
        params = ts["params"]
        if lora_lib.has_adapters(template.params):  # the adapters onto the template's base
            if "lora_base" not in meta:
                raise ValueError(f"checkpoint in {self.ckpt.directory} holds no LoRA "
                                 f"adapters but the model has model.lora")
            lora_params.check_base_fingerprint(meta["lora_base"]["fingerprint"],
                                               template.params, f"resuming {self.phase}")
            params = lora_lib.merge_trees(params, lora_lib.without_adapters(template.params))
        state = TrainState(step=ts["step"], params=params, opt_state=ts["opt_state"])
        return (state, meta, tree) if extra is not None else (state, meta)

    def latest_step(self) -> int | None:
        return self.ckpt.latest_step()

    def close(self) -> None:
        self.ckpt.close()


def report_fallback(ckpt: Checkpointer, what: str) -> None:
    """Tells the user (stderr, process 0) when the last restore skipped damaged steps."""
    if not ckpt.last_skipped or jax.process_index() != 0:
        return
    why = "; ".join(f"step {s}: {', '.join(p[:3])}" + (f" (+{len(p) - 3} more)" if len(p) > 3
                                                          else "")
                    for s, p in ckpt.last_skipped.items())
    print(f"[checkpoint] {what}: skipped damaged step(s) {list(ckpt.last_skipped)} in "
          f"{ckpt.directory} (left in place for inspection): {why}; using step "
          f"{ckpt.last_restored_step}", file=sys.stderr, flush=True)


def _has_complete_step(directory: str) -> bool:
    with Checkpointer(directory) as ckpt:
        return ckpt.latest_step() is not None


def resolve_checkpoint_dir(path: str) -> str:
    """A phase checkpoint directory from a run workdir or a phase directory.

    Given a workdir, the RL phase wins over SFT. Raises FileNotFoundError with what exists.
    Local or remote (gs://...) paths.
    """
    if not paths.as_path(path).is_dir():
        raise FileNotFoundError(f"checkpoint path {path!r} does not exist")
    for candidate in [phase_dir(path, phase) for phase in reversed(PHASES)] + [path]:
        if paths.as_path(candidate).is_dir() and _has_complete_step(candidate):
            return candidate
    raise FileNotFoundError(
        f"no complete checkpoint under {path!r}: expected a run workdir (with "
        f"checkpoints/sft or checkpoints/rl) or a phase checkpoint directory")


def load_params(path: str, mesh, rules, step: int | None = None):
    """Loads params, model config and tokenizer from a checkpoint (any phase).

    Args:
      path: a run workdir or a phase checkpoint directory.
      mesh, rules: target layout of the params.
      step: the step to load (an error if it is damaged); None = the newest complete step
        that is not damaged (damaged newer ones are skipped and reported on stderr).
    Returns: (params, ModelConfig, Tokenizer or HFTokenizer, metadata).
    """
    directory = resolve_checkpoint_dir(path)

    def target(meta):
        if "model_config" not in meta:
            raise ValueError(f"checkpoint in {directory} has no model_config in its metadata")
        model_cfg = ModelConfig(**meta["model_config"])
        if model_cfg.lora is not None and "lora_base" not in meta:
            model_cfg = model_cfg.replace(lora=None)  # a LoRA run's full-fine-tuning phase
        shardings = param_shardings(model_cfg, mesh, rules)
        params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract_params(model_cfg), shardings)
        if "lora_base" in meta:
            params = lora_lib.split_adapters(params)[0]
        return {"train_state": {"params": params}}

    with Checkpointer(directory) as ckpt:
        tree, meta = ckpt.restore(step, abstract_state_fn=target, partial=True)
        report_fallback(ckpt, f"loading params from {directory}")
    model_cfg = ModelConfig(**meta["model_config"])
    tokenizer = tokenizer_from_serialized(meta["tokenizer"])
    params = tree["train_state"]["params"]
    if "lora_base" in meta:
        base = lora_params.quantize_base(model_cfg, _lora_base_params(
            meta["lora_base"], model_cfg, mesh, rules), mesh, rules)
        lora_params.check_base_fingerprint(meta["lora_base"]["fingerprint"], base,
                                           f"loading the LoRA checkpoint in {directory}")
        params = lora_lib.merge_trees(params, base)
    return params, model_cfg, tokenizer, meta


def _lora_base_params(source: dict, model_cfg: ModelConfig, mesh, rules):
    """The float base params a LoRA checkpoint's "lora_base" metadata names (a Hugging Face
    directory, a phase checkpoint, or the random init of a seed), in `model_cfg`'s layout."""
    plain = model_cfg.replace(lora=None)
    if source["kind"] == "hf":
        from jaxrl_reason.models import hf
        return hf.load_hf_checkpoint(source["path"], mesh, rules, dtype=plain.param_dtype,
                                     compute_dtype=plain.dtype,
                                     scan_layers=plain.scan_layers)[1]
    if source["kind"] == "checkpoint":
        # an SFT phase that trained adapters too: its base, without them
        return to_layout(plain, lora_lib.without_adapters(
            load_params(source["path"], mesh, rules)[0]))
    if source["kind"] == "init":
        return init_params(plain, jax.random.key(source["seed"]), mesh, rules)
    raise ValueError(f"unknown LoRA base source {source!r} in checkpoint metadata")
