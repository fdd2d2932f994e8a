"""Cold-start supervised fine-tuning: masked next-token loss on completions only.

The batch layout is the RL trainer's (prompts left-padded to a bucket, completions
right-padded and ending with EOS), so SFT, RL and evaluation score sequences with the same
`completion_logprobs`. With `sft.packing` the step runs on padding-free packs of
`sft.pack_tokens` tokens (`rl/packing.py`, a prompt per row) and `packed_logprobs` reads the
same per-row log-probs back: the loss and its metrics are the padded step's, up to float
summation order.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.kernels import platform
from jaxrl_reason.data.pipeline import example_iterator
from jaxrl_reason.runtime.metrics import MetricsWriter, format_line
from jaxrl_reason.models.lora import dropout_key
from jaxrl_reason.models.lora_params import for_training
from jaxrl_reason.models.params import init_params
from jaxrl_reason.models.scoring import completion_logprobs
from jaxrl_reason.rl import micro, packing
from jaxrl_reason.rl.update import packed_logprobs
from jaxrl_reason.runtime.reliability import Preempted, SkipGuard, stop_requested
from jaxrl_reason.runtime.progress import ProgressBar
from jaxrl_reason.data.tasks import task_source
from jaxrl_reason.runtime.build import Runtime
from jaxrl_reason.checkpoints.phases import PhaseCheckpointer
from jaxrl_reason.sampling.sampler import right_pad, round_up
from jaxrl_reason.runtime.train_state import (TrainState, apply_gradients_if_finite,
                                      create_train_state, learning_rate_schedule,
                                      make_optimizer, trainable_params, value_and_grad)


def sft_examples(source: Sequence[Mapping[str, Any]], limit: int) -> Sequence[Mapping[str, Any]]:
    """The SFT data: `source` itself when its size is at most `limit` and its first example
    has a "completion" (procedural tasks); otherwise the first `limit` examples that have
    one (file tasks, where records without a worked solution serve RL only). ValueError when
    none has a completion."""
    if len(source) <= limit and len(source) and "completion" in source[0]:
        return source
    out = []
    for i in range(len(source)):
        example = source[i]
        if isinstance(example.get("completion"), str):
            out.append(example)
            if len(out) == limit:
                break
    if not out:
        raise ValueError("cold-start SFT: no training example has a 'completion' (or a "
                         "'solution' to build one from); give such records, or skip the "
                         "cold start with --init_checkpoint")
    return out


def sft_batch(rt: Runtime, examples: Sequence[Mapping[str, Any]], max_completion_length: int,
              length_bucket: int | None = None) -> dict[str, np.ndarray]:
    """Tokenizes (prompt, completion) examples into the padded SFT batch.

    Completions are padded to Lc = the longest completion (with EOS) rounded up to a multiple
    of `length_bucket`, capped at `max_completion_length` (Lc = max_completion_length when
    `length_bucket` is None), so a run compiles one step per bucket and does not pay for
    padding up to the longest possible trace.

    Returns numpy arrays: prompt_tokens int32 [B, Tp], prompt_valid bool [B, Tp],
    completion_tokens int32 [B, Lc], completion_mask f32 [B, Lc].
    Raises ValueError naming the example whose completion does not fit.
    """
    prompt_tokens, prompt_valid = rt.encode_prompts(examples)
    encoded = [rt.tokenizer.encode(example["completion"], add_eos=True) for example in examples]
    for i, (example, ids) in enumerate(zip(examples, encoded)):
        if len(ids) > max_completion_length:
            raise ValueError(
                f"SFT completion of example {example.get('id', i)!r} has {len(ids)} tokens, "
                f"more than sft.max_completion_length={max_completion_length}")
    length = max_completion_length
    if length_bucket:
        longest = max(len(ids) for ids in encoded)
        length = min(round_up(longest, length_bucket), max_completion_length)
    tokens, mask = right_pad(encoded, length, rt.tokenizer.pad_id)
    return {"prompt_tokens": prompt_tokens, "prompt_valid": prompt_valid,
            "completion_tokens": tokens, "completion_mask": mask}


def sft_packer(rt: Runtime) -> packing.Packer | None:
    """The SFT run's packer with `sft.packing` (None without): T = sft.pack_tokens, rows of
    at most max(task.prompt_buckets) + sft.max_completion_length - 1 tokens, pack counts
    multiples of the data-parallel size (with sft.micro_batches > 1, of the packs of a
    micro-batch, `Packer.packs_per_micro`)."""
    cfg = rt.config.sft
    if not cfg.get("packing", False):
        return None
    return packing.Packer(cfg.pack_tokens, cfg.batch_size,
                          max(rt.config.task.prompt_buckets) + cfg.max_completion_length - 1,
                          shd.data_parallel_size(rt.mesh, rt.rules),
                          packing.shares_prompts(rt.model_cfg),
                          int(cfg.get("micro_batches", 1)))


def packed_sft_batch(batch: Mapping[str, np.ndarray],
                     packer: packing.Packer) -> dict[str, np.ndarray]:
    """`sft_batch`'s arrays as packs: completion_mask f32 [B, Lc] and the
    `packing.Packs.arrays()` of its rows (a prompt per row; pack_index [B, Lc])."""
    mask = np.asarray(batch["completion_mask"])
    packs = packer(batch["prompt_tokens"], batch["prompt_valid"], batch["completion_tokens"],
                   (mask > 0).sum(axis=1))
    return {"completion_mask": mask, **packs.arrays()}


def sft_loss(model, params, batch, dropout_rng=None,
             share_prompts: bool | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean negative log-likelihood over completion tokens. Returns (loss f32 [], metrics).
    dropout_rng: the LoRA dropout key (`lora.dropout_key`), or None. share_prompts: None
    for `sft_batch`'s padded rows, else the batch is `packed_sft_batch`'s and this is its
    packer's `share_prompts`. A batch's `num_tokens` (f32 [], when present) is the
    denominator instead of its own completion tokens: a micro-batch's loss is then its
    share of the whole batch's."""
    if share_prompts is None:
        logp, _ = completion_logprobs(model, params, batch["prompt_tokens"],
                                      batch["prompt_valid"], batch["completion_tokens"],
                                      batch["completion_mask"], with_entropy=False,
                                      dropout_rng=dropout_rng)
    else:
        logp, _ = packed_logprobs(model, params, batch, temperature=1.0,
                                  share_prompts=share_prompts, with_entropy=False,
                                  dropout_rng=dropout_rng)
    tokens = batch.get("num_tokens", jnp.maximum(jnp.sum(batch["completion_mask"]), 1.0))
    loss = -jnp.sum(logp) / tokens
    return loss, {"loss": loss, "tokens": tokens}


def make_sft_step(model, optimizer, mesh=None, rules=(), dropout_seed: int = 0,
                  share_prompts: bool | None = None, micro_batches: int = 1,
                  packs_per_micro: int | None = None):
    """The jitted, state-donating SFT update: (state, batch) -> (state, metrics).
    mesh, rules: lay the activations out by `rules` (`sharding.activation_sharding`).
    dropout_seed: LoRA dropout's masks are folded from it and the optimizer step (and
    micro-batch i: folded with i).
    share_prompts: None for padded batches, else packed ones (`sft_loss`).
    micro_batches: padded rows, k > 1 strided micro-batches of B/k rows whose gradients are
    summed (gradient accumulation, one optimizer step; the loss divides by the whole
    batch's tokens). packs_per_micro: packed, the packs of a micro-batch
    (`Packer.packs_per_micro`; None: all at once), as many micro-batches as the packs fill.
    Metrics ("loss", "tokens") are the whole batch's either way."""
    split = micro.MicroBatches(share_prompts is not None, micro_batches, packs_per_micro,
                               mesh, tuple(rules), key="sft.micro_batches")

    def grad_fn(params, batch, rng):
        # only the LoRA adapters when the params hold any (train_state.value_and_grad)
        return value_and_grad(lambda p: sft_loss(model, p, batch, rng, share_prompts),
                              has_aux=True)(params)

    def micro_grad(params, batch, rng):  # a micro-batch's loss, no outputs, gradients
        (loss, _), grads = grad_fn(params, batch, rng)
        return (loss, ()), grads

    def step(state: TrainState, batch):
        rng = dropout_key(model.cfg.lora, dropout_seed, state.step)  # LoRA dropout, if any
        if split.count(batch) == 1:
            (loss, metrics), grads = grad_fn(state.params, batch, rng)
        else:
            tokens = jnp.maximum(jnp.sum(batch["completion_mask"]), 1.0)
            loss, _, grads = split.accumulate(
                micro.folding(micro_grad, rng), state.params, {**batch, "num_tokens": tokens},
                trainable_params(state.params), 0)  # LoRA: the adapters' gradients
            metrics = {"loss": loss, "tokens": tokens}
        state, grad_norm, ok = apply_gradients_if_finite(state, grads, loss, optimizer)
        return state, {**metrics, "grad_norm": grad_norm, "update_skipped": 1.0 - ok}

    return jax.jit(shd.with_activation_sharding(step, mesh, rules), donate_argnums=0,
                   compiler_options=platform.compiler_options("dense", mesh))


def run_sft(rt: Runtime, writer: MetricsWriter, *, params: Any = None,
            resume: bool = True, base_checkpoint: str | None = None) -> Any:
    """Runs the cold-start SFT phase of `rt.config.sft` and returns the trained params.

    Starts from `params` (random init from config.seed when None). With `resume`, continues
    from the newest complete checkpoint in `<workdir>/checkpoints/sft`; a finished phase is
    not re-run. `base_checkpoint`: the checkpoint `params` were loaded from; LoRA
    checkpoints name it as their frozen base (default: the run's hf_model or the seed's
    random init).
    """
    cfg = rt.config.sft
    optimizer = make_optimizer(
        learning_rate_schedule(cfg.learning_rate, cfg.warmup_steps, cfg.steps, "cosine"),
        weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
    # A run with model.lora trains adapters in SFT only with sft.lora (else SFT fully
    # fine-tunes the plain base, e.g. a cold start from random weights, and RL adds them).
    lora = rt.model_cfg.lora is not None and bool(cfg.get("lora", False))
    if params is None:
        plain = rt.model_cfg if lora else rt.model_cfg.replace(lora=None)
        params = init_params(plain, jax.random.key(rt.config.seed), rt.mesh, rt.rules)
    if lora:
        params = for_training(rt.model_cfg, params, jax.random.key(rt.config.seed + 1),
                              rt.mesh, rt.rules)
    state = create_train_state(params, optimizer)
    source = sft_examples(task_source(rt.config, "train", rt.config.task.train_levels,
                                      cfg.num_examples, seed=rt.config.seed), cfg.num_examples)
    data = example_iterator(source, batch_size=cfg.batch_size, seed=rt.config.seed)

    ckpt = PhaseCheckpointer(rt, "sft", base_checkpoint=base_checkpoint)
    restored = ckpt.restore_latest(state) if resume else None
    start = 0
    if restored is not None:
        state, meta = restored
        data.set_state(meta["data_iterator"])
        # The loop's step (skipped updates leave the optimizer's step count behind).
        start = int(meta.get("step", int(state.step)))
    if start >= cfg.steps:
        return state.params

    writer.truncate("sft", after_step=start)  # a resumed run rewrites the steps it redoes
    packer = sft_packer(rt)  # sft.packing: rows of one length, only the pack count varies
    step_fn = make_sft_step(rt.model, optimizer, rt.mesh, rt.rules,
                            dropout_seed=rt.config.seed + 4,
                            share_prompts=None if packer is None else packer.share_prompts,
                            micro_batches=int(cfg.get("micro_batches", 1)),
                            packs_per_micro=None if packer is None else packer.packs_per_micro)
    guard = SkipGuard("sft", rt.config.guards.max_consecutive_skips)
    with ProgressBar(cfg.steps, "sft", enabled=rt.config.log.progress_bar) as bar:
        bar.update(start)
        for step in range(start + 1, cfg.steps + 1):
            t0 = time.time()
            examples = next(data)
            batch = sft_batch(rt, examples, cfg.max_completion_length,
                              cfg.length_bucket if packer is None else None)
            batch = batch if packer is None else packed_sft_batch(batch, packer)
            state, metrics = step_fn(state, {k: rt.put(v) for k, v in batch.items()})
            metrics = {k: float(v) for k, v in distributed.to_host(metrics).items()}
            metrics["step_time_s"] = time.time() - t0
            writer.write(step, metrics, phase="sft")
            bar.update(1, format_line(step, metrics, keys=("loss", "grad_norm")))
            guard.update(step, metrics["update_skipped"] > 0, "non-finite loss or gradient",
                         (e.get("id") for e in examples))
            if step % rt.config.checkpoint.every_steps == 0 or step == cfg.steps \
                    or stop_requested():
                ckpt.save(step, state, data.get_state(), extra_meta={"step": step})
            if stop_requested() and step < cfg.steps:
                ckpt.close()
                raise Preempted("sft", step)
    ckpt.close()
    return state.params
