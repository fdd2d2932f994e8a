"""Everything a run builds from its config before any step: mesh, tokenizer, model, sampler, data.

`build_runtime` is shared by `sft`, `train`, `eval` and `sample`, so all of them see the
same tokenizer, the same model shapes and the same mesh for the same config.

Multi-host: the mesh spans the devices of every process; process 0 builds the tokenizer
and sends it to the others (one vocabulary for all); host batches are the same on every
process and become global arrays through `put` / `put_prompts` (see `distributed`); the
sampler's outputs come back replicated on every device (`GatheredSampler`), so every
process can read every row (the verifiers need the texts) with a plain `jax.device_get`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import paths
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.data.tasks import get_task
from jaxrl_reason.models.config import ModelConfig
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.sampling.sampler import SampleOutput, Sampler, left_pad, pick_bucket
from jaxrl_reason.sampling.tool_loop import ToolSampler
from jaxrl_reason.tools import build_tool_runner, tool_symbols, tools_enabled
from jaxrl_reason.tokenizers import (SPECIAL_TAGS, HFTokenizer, Tokenizer, load_tokenizer,
                                     tokenizer_from_serialized, train_tokenizer)

TOKENIZER_FILE = "tokenizer.model"


@dataclasses.dataclass
class Runtime:
    """The built pieces of a run (no params: those come from init or a checkpoint)."""
    config: ml_collections.ConfigDict
    workdir: str
    mesh: Mesh
    rules: tuple
    tokenizer: Tokenizer | HFTokenizer
    model_cfg: ModelConfig
    model: Transformer
    sampler: Sampler | ToolSampler  # a ToolSampler when config.tools is enabled

    def encode_prompt(self, text: str) -> list[int]:
        """The ids of one prompt text (python ints), with a bos first when the tokenizer's
        model expects one (`add_bos_token`: every tokenizer trained here; not Qwen)."""
        return self.tokenizer.encode(text, add_bos=self.tokenizer.add_bos_token)

    def encode_prompts(self, examples: Sequence[Mapping[str, Any]]):
        """Tokenizes and left-pads the prompts of `examples` to the smallest fitting bucket.

        Returns numpy (tokens int32 [P, Tp], valid bool [P, Tp]). Raises ValueError naming
        the example when a prompt is longer than every bucket. On multi-host, checks that
        every process encoded the same prompts (a collective; RuntimeError otherwise).
        """
        ids = [self.encode_prompt(e["prompt"]) for e in examples]
        buckets = tuple(self.config.task.prompt_buckets)
        for e, row in zip(examples, ids):
            if len(row) > max(buckets):
                raise ValueError(
                    f"prompt of example {e.get('id', '?')!r} has {len(row)} tokens, longer than "
                    f"the largest bucket in task.prompt_buckets={buckets}")
        tokens, valid = left_pad(ids, pick_bucket((len(r) for r in ids), buckets),
                                 self.tokenizer.pad_id)
        distributed.check_same("prompt batches", tokens, valid)
        return tokens, valid

    def put(self, array: np.ndarray) -> jax.Array:
        """A host batch (the same on every process) placed on the mesh, batch-sharded (rows
        must split evenly)."""
        return shd.put_batch(self.mesh, self.rules, array)

    def put_prompts(self, array: np.ndarray) -> jax.Array:
        """Prompts for the sampler: batch-sharded when they split evenly, else replicated.

        The sampler repeats each prompt G times after prefill; only those rows must split
        over the data-parallel shards, not the (small) prompt batch itself.
        """
        if len(array) % shd.data_parallel_size(self.mesh, self.rules) == 0:
            return self.put(array)
        return shd.put_replicated(self.mesh, array)


class GatheredSampler(Sampler):
    """The sampler of a multi-host run: the same program, followed by an all-gather of its
    outputs (tokens, log-probs, lengths, truncated) to every device, the collective that
    `distributed.to_host` would otherwise run. Callers then read rows with `jax.device_get`
    on any process, as on one host. ([N, L] int32 + f32 per device: small next to the
    KV cache the sampler just freed.)"""

    def __call__(self, *args, **kwargs) -> SampleOutput:
        out = super().__call__(*args, **kwargs)
        if self.mesh is None:
            return out
        return _replicate(out, shd.replicated(self.mesh))


@functools.partial(jax.jit, static_argnums=1)
def _replicate(tree, sharding):
    return jax.lax.with_sharding_constraint(tree, sharding)


# ModelConfig fields that are training/memory knobs, not architecture: with `hf_model` they
# come from the config's `model` block, everything else from the checkpoint's config.json.
HF_KNOBS = ("dtype", "param_dtype", "remat", "scan_layers", "logprobs_impl",
            "logprobs_seq_chunk", "logprobs_vocab_chunk", "attention_chunk", "attention_impl",
            "lora")


def hf_model_config(config: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
    """The ModelConfig of `config.hf_model` (its config.json) with the `model` block's knobs
    (`HF_KNOBS`); ValueError when the tokenizer has more pieces than the embedding rows."""
    from jaxrl_reason.models.hf import load_hf_config
    cfg = load_hf_config(config.hf_model)
    cfg = cfg.replace(**{k: config.model[k] for k in HF_KNOBS if k in config.model})
    if vocab_size > cfg.vocab_size:
        raise ValueError(f"hf_model={config.hf_model!r}: the tokenizer has {vocab_size} "
                         f"pieces but the model's embedding only {cfg.vocab_size} rows")
    return cfg


def model_config(model: ml_collections.ConfigDict, vocab_size: int) -> ModelConfig:
    """ModelConfig from the config's `model` block; vocab_size 0 takes the tokenizer's."""
    fields = model.to_dict()
    if not fields.get("vocab_size"):
        fields["vocab_size"] = vocab_size
    elif fields["vocab_size"] < vocab_size:
        raise ValueError(f"model.vocab_size={fields['vocab_size']} is smaller than the "
                         f"tokenizer's {vocab_size} pieces")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"model: unknown fields {unknown}; known fields: {sorted(known)}")
    return ModelConfig(**fields)


def build_tokenizer(config: ml_collections.ConfigDict, workdir: str) -> Tokenizer | HFTokenizer:
    """The run's tokenizer: `tokenizer.path` if set, else the workdir's, else a new one.

    `tokenizer.path` is a model directory (Hugging Face layout) or one vocabulary file
    (`.model` or `tokenizer.json`), read by `load_tokenizer`.

    A newly trained tokenizer (deterministic for the config) is saved to the workdir so
    that every later phase and a resumed run use the very same ids. On multi-host, process 0
    does all this and sends the result to the other processes (which read and write nothing).
    """
    if distributed.process_count() == 1:
        return _build_tokenizer(config, workdir)
    tokenizer, error = None, None
    if distributed.is_primary():
        try:
            tokenizer = _build_tokenizer(config, workdir)
        except (OSError, ValueError) as e:  # every process must fail, not wait for process 0
            error = e
    serialized, error = distributed.broadcast_from_primary(
        (tokenizer.serialized if tokenizer is not None else None, error))
    if error is not None:
        raise error
    return tokenizer if tokenizer is not None else tokenizer_from_serialized(serialized)


def _build_tokenizer(config: ml_collections.ConfigDict,
                     workdir: str) -> Tokenizer | HFTokenizer:
    """`build_tokenizer` on one process."""
    if config.tokenizer.path:
        if not os.path.exists(config.tokenizer.path):
            raise FileNotFoundError(f"tokenizer.path={config.tokenizer.path!r} does not exist")
        return load_tokenizer(config.tokenizer.path)
    if config.get("hf_model"):  # the model directory's own tokenizer
        if not os.path.isdir(config.hf_model):
            raise FileNotFoundError(f"hf_model={config.hf_model!r} is not a directory")
        return load_tokenizer(config.hf_model)
    saved = os.path.join(workdir, TOKENIZER_FILE)
    if paths.is_remote(workdir):  # gs://...: through etils.epath
        remote = paths.as_path(saved)
        if remote.is_file():
            return tokenizer_from_serialized(remote.read_bytes())
    elif os.path.isfile(saved):
        return Tokenizer.load(saved)
    corpus = get_task(config.task.name).corpus(config, config.tokenizer.corpus_examples)
    # Tool tags (config.tools) are single tokens, so that a closing tag is one stop-like id.
    tokenizer = train_tokenizer(corpus, config.tokenizer.vocab_size,
                                extra_symbols=SPECIAL_TAGS + tool_symbols(config))
    if paths.is_remote(workdir):
        paths.write_bytes_atomic(saved, tokenizer.serialized)  # a bare .model file
    else:
        os.makedirs(workdir, exist_ok=True)
        tokenizer.save(saved)
    return tokenizer


def with_tools(sampler: Sampler, config: ml_collections.ConfigDict,
               tokenizer) -> Sampler | ToolSampler:
    """`sampler` wrapped in a ToolSampler running config.tools' tools when they are enabled
    (generation pauses at each closing tag while the host runs the call), else `sampler`."""
    if not tools_enabled(config):
        return sampler
    return ToolSampler(sampler, build_tool_runner(config.tools), tokenizer,
                       max_calls=config.tools.max_calls,
                       max_result_tokens=config.tools.max_result_tokens)


def build_runtime(config: ml_collections.ConfigDict, workdir: str, *,
                  tokenizer: Tokenizer | HFTokenizer | None = None,
                  devices: Sequence[jax.Device] | None = None) -> Runtime:
    """Builds mesh, tokenizer, model and sampler for `config` (no parameter allocation)."""
    dcn = config.get("distributed", {}).get("dcn_mesh", None)
    mesh = shd.make_mesh(dict(config.mesh), devices, dcn=dict(dcn) if dcn else None)
    rules = tuple((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes)
                  for name, axes in config.sharding_rules)
    tokenizer = tokenizer or build_tokenizer(config, workdir)
    if config.get("hf_model"):
        model_cfg = hf_model_config(config, tokenizer.vocab_size)
    else:
        model_cfg = model_config(config.model, tokenizer.vocab_size)
    model = Transformer(model_cfg)
    sampler_cls = GatheredSampler if jax.process_count() > 1 else Sampler
    rl = config.get("rl") or {}
    sampler = sampler_cls(model, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, mesh=mesh,
                          rules=shd.sampling_rules(rules, mesh),  # rows over context too
                          max_num_seqs=rl.get("max_num_seqs", 0),
                          refill_every=rl.get("refill_every", 8),
                          min_slots=rl.get("refill_min_slots", 4))
    sampler = with_tools(sampler, config, tokenizer)  # RL rollouts, eval, distill
    return Runtime(config=config, workdir=workdir, mesh=mesh, rules=rules, tokenizer=tokenizer,
                   model_cfg=model_cfg, model=model, sampler=sampler)
