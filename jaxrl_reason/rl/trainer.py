"""The RL loop: collect -> shape rewards -> advantages -> update batch -> update -> metrics.

Algorithms (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++, PPO) differ only in the config fields
that name the advantage estimator (or PPO's critic), its scale, the loss aggregation, the clip
range and the KL estimator; there is one trainer, and `RLTrainer.step` is the algorithm, one
phase a line. Per step, with B prompts and G samples each (N = B * G rows, group-major):

  collect        sampler (jit, on the mesh, live params) -> tokens [N, L], lengths, sampler
                 log-probs; the reference's log-probs dispatched on the device while host
                 threads decode and verify the completions -> rewards [N]; with DAPO's
                 dynamic sampling, more rounds until B groups have reward variance
  shape rewards  the KL in the reward (per sequence, or per token for the critic)
  advantages     a group estimator of `rl/advantages.py` -> [N], or the critic's GAE
                 (`rl/critic.py`) -> [N, L]
  update batch   the rows to train on, the whole batch's normalizers, the old-policy
                 log-probs (num_iterations > 1)
  update         `num_iterations` jitted, donated updates of the clipped loss (and of the
                 critic); adaptive KL and reference sync
  metrics        to tensorboard, console and metrics.jsonl; checkpoint every k steps (`run`)

Rows whose advantage is 0 (every group whose samples all earned the same reward) add nothing
to the loss when there is no KL term (beta = 0): with `rl.skip_zero_advantage_rows` the update
runs on the other rows only, padded to one of `rl.train_row_buckets` sizes so that a run
compiles a handful of programs, with the whole batch's normalizers, so the loss and gradient
are the whole batch's (up to float summation order) at a fraction of the cost.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.runtime import distributed
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.data.pipeline import example_iterator
from jaxrl_reason.runtime.metrics import MetricsWriter, format_line
from jaxrl_reason.runtime.progress import ProgressBar
from jaxrl_reason.runtime.reliability import Preempted, SkipGuard, stop_requested
from jaxrl_reason.rewards.pool import BatchRewards, make_reward_pool
from jaxrl_reason.rl.batches import Collected, Rollout, dynamic_sampling, select_train_rows
from jaxrl_reason.rl.rollout_metrics import rollout_metrics
from jaxrl_reason.rl.losses import kl_penalty, kl_reward_penalty
from jaxrl_reason.rl.learned_reward import load_reward_component
from jaxrl_reason.models.lora import without_adapters
from jaxrl_reason.models.lora_params import check_rl_config as check_lora_rl_config
from jaxrl_reason.models.lora_params import for_training as lora_for_training
from jaxrl_reason.rl.critic import Critic
from jaxrl_reason.rl.partial import PartialRollouts
from jaxrl_reason.rl.staleness import RolloutQueue, Sampled, check_resume_bound
from jaxrl_reason.rl.group_estimator import GroupEstimator
from jaxrl_reason.checkpoints.phases import PhaseCheckpointer
from jaxrl_reason.data.tasks import task_source, task_verifier
from jaxrl_reason.runtime.build import Runtime
from jaxrl_reason.sampling.sampler import round_up
from jaxrl_reason.sampling.tool_loop import ToolSampleOutput, tool_loss_mask
from jaxrl_reason.rl.update import adaptive_kl_beta, make_update_fn, mix_reference
from jaxrl_reason.rl.packed_passes import LogprobPasses
from jaxrl_reason.runtime.train_state import (TrainState, create_train_state,
                                              learning_rate_schedule, make_optimizer)

TRAIN_SIZE = 10_000_000  # the procedurally generated training set is effectively unbounded


class RLTrainer:
    """GRPO-family trainer on one mesh. `run()` executes `config.rl.steps` steps.

    `init_params` become the policy's training state and their buffers are donated to the
    first update (copy them first if the caller needs them afterwards); with beta > 0 a
    separate frozen copy is kept as the reference (or `ref_params` when given). With
    `num_iterations > 1`, `step()` reports the metrics of the last update of the batch.
    """

    def __init__(self, rt: Runtime, writer: MetricsWriter, *, init_params, ref_params=None,
                 base_checkpoint: str | None = None):
        """`base_checkpoint`: the checkpoint `init_params` were loaded from, when not this
        run's own SFT phase (`train --init_checkpoint`); a LoRA run's checkpoints name it as
        the frozen base they need."""
        self.rt, self.writer, self.rl = rt, writer, rt.config.rl
        rl = self.rl
        # LoRA (model.lora): the policy trains only adapters attached to `init_params`, and
        # the reference is the same params with the adapters removed (no copy).
        check_lora_rl_config(rt.model_cfg, rl)
        self.lora = rt.model_cfg.lora is not None
        init_params = lora_for_training(rt.model_cfg, init_params,
                                        jax.random.key(rt.config.seed + 3), rt.mesh, rt.rules)
        self.optimizer = make_optimizer(
            learning_rate_schedule(rl.learning_rate, rl.warmup_steps, rl.steps,
                                   rl.lr_decay),
            weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm)
        self.state = self._offload_optimizer(create_train_state(init_params, self.optimizer))
        # The frozen reference: a separate copy (the policy's buffers are donated), in host
        # memory between its log-prob passes with rl.offload_reference.
        self.ref_params = None
        self.beta = float(rl.beta)  # the KL coefficient; moves with an adaptive KL target
        if rl.beta > 0 and self.lora:
            self.ref_params = {}  # the base inside self.state.params (`_reference`)
        elif rl.beta > 0:
            src = init_params if ref_params is None else ref_params
            self.ref_params = (shd.to_memory(src, "pinned_host")
                               if rl.get("offload_reference", False)
                               else jax.tree.map(jnp.copy, src))
        self.rng = jax.random.key(rt.config.seed + 1)
        source = task_source(rt.config, "train", rt.config.task.train_levels, TRAIN_SIZE,
                             seed=rt.config.seed + 1)
        self.data = example_iterator(source, batch_size=rl.batch_prompts, seed=rt.config.seed)
        self.verifier = task_verifier(rt.config)
        # A trained reward model as one more component (rewards.reward_model_dir), on this mesh.
        self.reward_model = load_reward_component(rt.config, rt.mesh, rt.rules, rt.tokenizer)
        self.rewards = make_reward_pool(rt.config)
        self.step_count = 0  # RL steps taken by this trainer (restored with the state)
        self.skipped_batch = None  # (why, example ids) when `step` skipped its update
        self.kernel_backend = rt.config.get("kernels", {}).get("backend", "auto")
        # Where the advantages come from: PPO's critic (built before the first update donates
        # `init_params`) or a group estimator of the registry; the one place that asks. A
        # critic's advantages are per token: its passes take a prompt per row, no row is
        # skipped, and the KL in the reward goes into its token rewards.
        self.logprobs = LogprobPasses(rt, rl)  # rl.packing: passes on padding-free packs
        self.packed, self.logprob_fn = self.logprobs.packed, self.logprobs.padded_fn
        self.advantage_source = (Critic(rt, rl, init_params, ref_params,
                                        policy_params=lambda: self.state.params,
                                        packer=self.packed and self.packed.packer)
                                 if rl.advantage_estimator == "gae"
                                 else GroupEstimator(rl, self.kernel_backend))
        per_token = self.advantage_source.per_token
        self.prompt_per_row = per_token
        # Zero-advantage rows carry no loss term only without the KL penalty.
        self.skip_rows = bool(rl.skip_zero_advantage_rows) and rl.beta == 0 and not per_token
        self.kl_in_reward = (None if not rl.kl_in_reward or self.ref_params is None
                             else "token" if per_token else "sequence")
        self.update_fn = make_update_fn(
            rt.model, self.optimizer, rl, rt.mesh, rt.rules, self.kernel_backend,
            dropout_seed=rt.config.seed + 4, packed=self.packed is not None,
            share_prompts=self.packed is not None and self.packed.share_prompts,
            packs_per_micro=self.packed and self.packed.packer.packs_per_micro)
        self.ckpt = PhaseCheckpointer(rt, "rl", base_checkpoint=base_checkpoint)
        # rl.rollout_token_budget: rows not done within it continue in later steps.
        self.partial = (PartialRollouts(rt, rl) if rl.get("rollout_token_budget", 0)
                        else None)
        # rl.max_staleness = k > 0: up to k scored batches sampled ahead (`rl/staleness.py`).
        stale = int(rl.get("max_staleness", 0) or 0)
        self.queue = (RolloutQueue(stale, rl.batch_prompts * rl.num_generations,
                                   rl.max_new_tokens) if stale else None)

    # ------------------------------------------------------------------ host offload

    def _reference(self):
        """The reference params on the chips (a transient copy when they live in host
        memory: it is freed once the log-prob pass that reads it is done). LoRA: the
        policy's params without the adapters."""
        if self.lora:
            return without_adapters(self.state.params)
        if self.rl.get("offload_reference", False):
            return shd.to_memory(self.ref_params, "device")
        return self.ref_params

    def _offload_optimizer(self, state: TrainState) -> TrainState:
        """`state` with its optimizer state in host memory (rl.offload_optimizer): the
        sampler and log-prob passes then have that HBM for the KV cache and activations."""
        if not self.rl.get("offload_optimizer", False):
            return state
        return state.replace(opt_state=shd.to_memory(state.opt_state, "pinned_host"))

    def _onload_optimizer(self, state: TrainState) -> TrainState:
        """`state` with its optimizer state back on the chips for the update."""
        if not self.rl.get("offload_optimizer", False):
            return state
        return state.replace(opt_state=shd.to_memory(state.opt_state, "device"))

    # ------------------------------------------------------------------ checkpoints

    def _extra(self) -> dict:
        extra = {"rng": jax.random.key_data(self.rng)}
        if self.ref_params:  # LoRA's reference is the saved policy's base
            extra["ref_params"] = self.ref_params
        if self.partial is not None:  # the pending rows
            extra["partial"] = self.partial.checkpoint_arrays()
        if self.queue is not None:  # the batches sampled ahead
            extra["in_flight"] = self.queue.checkpoint_arrays()
        return {**extra, **self.advantage_source.checkpoint_extra()}

    def save(self, step: int) -> None:
        meta = {"beta": self.beta, "step": step}
        if self.partial is not None:
            meta["partial"] = self.partial.checkpoint_meta()
        if self.queue is not None:
            meta["in_flight"] = self.queue.checkpoint_meta(self.agreed)
        self.ckpt.save(step, self.state, self.data.get_state(), extra=self._extra(),
                       extra_meta=meta)

    def restore(self) -> bool:
        """Continues from the newest complete RL checkpoint; False when there is none."""
        if self.ckpt.latest_step() is not None:  # before the arrays: their shapes depend on k
            check_resume_bound(self.ckpt.ckpt.metadata(), self.queue, self.ckpt.ckpt.directory)
        restored = self.ckpt.restore_latest(self.state, self._extra())
        if restored is None:
            return False
        self.state, meta, extra = restored
        # The loop's step (skipped updates leave the optimizer's step count behind).
        self.step_count = int(meta.get("step", int(self.state.step) // self.rl.num_iterations))
        self.data.set_state(meta["data_iterator"])
        self.beta = float(meta.get("beta", self.rl.beta))
        self.rng = jax.random.wrap_key_data(extra["rng"])
        if self.ref_params:
            self.ref_params = extra["ref_params"]
        self.advantage_source.restore_extra(extra)
        if self.partial is not None:
            self.partial.restore(extra["partial"], meta["partial"])
        if self.queue is not None:
            self.queue.restore(distributed.to_host(extra["in_flight"]), meta["in_flight"],
                               self.rt.encode_prompts)
        return True

    # ------------------------------------------------------------------ one step

    def step(self, examples) -> dict[str, float]:
        """One RL step on B `examples`: the algorithm, a phase a line. Returns the step's
        metrics (floats): the update's, the rewards' and completions', the phase times;
        `update_skipped` = 1 and no update when every reward is non-finite."""
        self.rng, rng = jax.random.split(self.rng)
        return self.train_on(self.collect(examples, rng))

    def train_on(self, got: Collected) -> dict[str, float]:
        """The phases after collect on `got`: shape rewards, advantages, update batch,
        update, metrics (see `step`)."""
        t0 = time.time()
        if got.num_rows == 0:  # partial rollouts: no group is complete yet
            self.step_count += 1
            return {**got.metrics, **got.times}
        if got.every_reward_nonfinite():  # nothing to learn from
            return self._skip_update(got, t0)
        seq_rewards, kl, shaping = self.shape_rewards(got)
        targets = self.advantages(got, seq_rewards, kl)
        batch, train_rows = self.update_batch(got, targets)
        metrics = self.update(batch)
        got.times["time/train_s"] = time.time() - t0
        return self.step_metrics(got, metrics, shaping, train_rows)

    def step_ahead(self, step: int) -> tuple[dict[str, float], list]:
        """One RL step with rl.max_staleness = k > 0 (`rl/staleness.py`): samples and scores
        the batches still missing up to batch min(step + k, rl.steps) with the current
        policy, then trains on the oldest one, batch `step`. Returns (metrics, its
        examples); the metrics add async/staleness (updates between the batch's policy and
        this one), async/stale_token_share and async/in_flight (batches left ahead). A batch
        is scored on host threads from when it is sampled until it is trained on, while the
        device updates on the batches before it."""
        t0 = time.time()
        for _ in self.queue.wanted(step, self.rl.steps):  # scored on host threads meanwhile
            examples = next(self.data)
            self.rng, rng = jax.random.split(self.rng)
            host = self.generate(examples, rng)
            self.queue.push(Sampled(list(examples), host, self.score(examples, host),
                                    self.step_count))
        batch = self.queue.pop()
        got = Collected(batch.examples, batch.host)
        got.times["time/sample_s"], t0 = time.time() - t0, time.time()
        self._dispatch_reference(got)
        got.rewards = self.queue.settled(batch, self.agreed)  # usually scored long ago
        got.times["time/score_s"] = time.time() - t0
        staleness = self.step_count - batch.version
        got.metrics.update({"async/staleness": float(staleness),
                            "async/stale_token_share": float(staleness > 0),
                            "async/in_flight": float(len(self.queue))})
        return self.train_on(got), batch.examples

    # ------------------------------------------------------------------ collect

    def generate(self, examples: Sequence[Mapping[str, Any]], rng) -> dict[str, np.ndarray]:
        """Samples G completions per example; returns host copies: tokens int32 [N, Lmax],
        lengths int32 [N], truncated bool [N] (rows, group-major), prompt_tokens int32
        [P, Tp] / prompt_valid bool [P, Tp] (one row per example) and `length`, the training
        length bucket that covers the longest completion; with `config.tools` also tool_mask
        bool [N, Lmax] (result tokens, written by the host) and tool_calls int32 [N]."""
        rt, rl = self.rt, self.rl
        prompt_tokens, prompt_valid = rt.encode_prompts(examples)
        pt, pv = rt.put_prompts(prompt_tokens), rt.put_prompts(prompt_valid)
        out = rt.sampler(self.state.params, pt, pv, rng, num_samples=rl.num_generations,
                         max_new_tokens=rl.max_new_tokens, temperature=rl.temperature,
                         top_p=rl.top_p, top_k=rl.top_k)
        # Every process gets every row (an all-gather on multi-host): the host side below
        # (decoding, rewards, row selection) is then the same on all of them.
        arrays = {"tokens": out.tokens, "lengths": out.lengths, "truncated": out.truncated,
                  "sampler_logp": out.logprobs}
        if isinstance(out, ToolSampleOutput):  # config.tools: result tokens in place
            arrays.update(tool_mask=out.tool_mask, tool_calls=out.tool_calls)
        host = distributed.to_host(arrays)
        host.update(prompt_tokens=prompt_tokens, prompt_valid=prompt_valid)
        # Train on a length bucket that covers the longest completion, not the whole budget.
        host["length"] = min(round_up(int(host["lengths"].max()), rl.train_length_bucket),
                             rl.max_new_tokens)
        return host

    def rollout(self, host: Mapping[str, np.ndarray], rows: np.ndarray | None = None,
                real: np.ndarray | None = None) -> Rollout:
        """The update batch of `rows` (int [M], default all N) of `generate`'s output; rows
        whose `real` (bool [M]) is False are padding and get an all-zero mask.

        With every row in order (and no critic, whose passes take a prompt per row), the
        prompts stay one per group [P, Tp]: the log-prob passes then run each prompt once
        and share its KV cache with its G completions (`completion_hidden`)."""
        n = len(host["lengths"])
        if (rows is not None and np.array_equal(rows, np.arange(n))
                and (real is None or np.all(real))):
            rows = real = None
        shared = rows is None and not self.prompt_per_row
        if rows is None:
            rows = np.arange(n)
        lengths = self.train_lengths(host)[rows]
        if real is not None:
            lengths = np.where(real, lengths, 0)
        length, put = host["length"], self.rt.put
        prompt_rows = (np.arange(len(host["prompt_tokens"])) if shared
                       else rows // self.rl.num_generations)
        mask = put((np.arange(length)[None, :] < lengths[:, None]).astype(np.float32))
        # Tool results are read by every pass but are not the policy's tokens: no loss, no KL.
        loss_mask = (mask if "tool_mask" not in host else
                     put(tool_loss_mask(lengths, length, host["tool_mask"][rows])))
        put_prompts = self.rt.put_prompts if shared else put
        return Rollout(
            prompt_tokens=put_prompts(host["prompt_tokens"][prompt_rows]),
            prompt_valid=put_prompts(host["prompt_valid"][prompt_rows]),
            completion_tokens=put(host["tokens"][rows, :length]), mask=mask,
            loss_mask=loss_mask)

    def train_lengths(self, host: Mapping[str, np.ndarray]) -> np.ndarray:
        """int [N] tokens of each row that the loss sees: 0 for truncated rows when
        `rl.mask_truncated_completions` (DAPO's overlong filtering), else the length."""
        if self.rl.mask_truncated_completions:
            return np.where(host["truncated"], 0, host["lengths"])
        return host["lengths"]

    def sample(self, examples: Sequence[Mapping[str, Any]], rng) -> tuple[Rollout, dict]:
        """`generate`, and the update batch of all its rows."""
        host = self.generate(examples, rng)
        return self.rollout(host), host

    def score(self, examples, host) -> Any:
        """Starts host-side scoring (and the reward model's, on the device, when the config
        names one); returns a future of BatchRewards (pass its result through `agreed`
        before acting on it)."""
        tok = self.rt.tokenizer
        texts = [tok.decode(row[:n]) for row, n in zip(host["tokens"], host["lengths"])]
        rows = [ex for ex in examples for _ in range(self.rl.num_generations)]
        future = self.rewards.submit(texts, rows, lengths=host["lengths"],
                                     truncated=host["truncated"],
                                     max_length=self.rl.max_new_tokens,
                                     group_size=self.rl.num_generations)
        if self.reward_model is None:
            return future
        # The reward model scores the rows on the device while the host verifiers run.
        return self.reward_model.submit(future, self.rt.put, host, self.rl.num_generations)

    @staticmethod
    def agreed(rewards: BatchRewards) -> BatchRewards:
        """Process 0's rewards on every process (itself with one process). Each process
        scores the same texts, but a verifier that times out on one host and not on another
        would make processes pick different rows and shapes, and the collectives would hang."""
        return distributed.broadcast_from_primary(rewards)

    def collect(self, examples, rng) -> Collected:
        """Collect phase: samples and scores the B `examples` (with `rl.dynamic_sampling`,
        more rounds: `dynamic_sampling`) and dispatches the reference's log-probs f32 [N, L]
        of the N rows. Without dynamic sampling the rows are known before scoring, so the
        reference pass runs on the device while the host scores. Times: time/sample_s
        (sampling, and with dynamic sampling every round's scoring), time/score_s (the rest)."""
        t0 = time.time()
        if self.partial is not None:  # the groups complete this step
            done, host, metrics = self.partial.collect(self.state.params, examples, rng,
                                                       self.step_count + 1)
            got = Collected(done, host, metrics=metrics)
        elif self.rl.dynamic_sampling:  # rows are only known after scoring: no overlap possible
            got = Collected(*dynamic_sampling(examples, rng, self.rl, lambda: next(self.data),
                                              self.sample_scored))
        else:
            got = Collected(list(examples), self.generate(examples, rng))
        got.times["time/sample_s"], t0 = time.time() - t0, time.time()
        if got.num_rows == 0:  # partial rollouts: nothing complete to score
            return got
        self._dispatch_reference(got)  # device work first (asynchronous dispatch)
        if got.rewards is None:  # then host scoring while it runs
            got.rewards = self.agreed(self.score(got.examples, got.host).result())
        got.times["time/score_s"] = time.time() - t0
        return got

    def _dispatch_reference(self, got: Collected) -> None:
        """With rl.packing, the rows' length is the buffer's; with a reference, its
        log-probs of `got`'s rows are dispatched on the device (`got.ref_logp`)."""
        if self.packed is not None:  # rows of one length: only the pack count varies
            got.host["length"] = got.host["tokens"].shape[1]
        if self.ref_params is not None:
            got.ref_logp = self.logprobs.of_step(self._reference(), got,
                                                 lambda: self._full_rollout(got),
                                                 self.train_lengths(got.host))

    def sample_scored(self, examples, rng) -> tuple[dict, BatchRewards]:
        """`generate`'s host arrays for `examples` and their rewards, agreed by every
        process."""
        host = self.generate(examples, rng)
        return host, self.agreed(self.score(examples, host).result())

    def _full_rollout(self, got: Collected) -> Rollout:
        """The update batch of all N rows of `got` (made once, kept in `got.rollout`)."""
        if got.rollout is None:
            got.rollout = self.rollout(got.host)
        return got.rollout

    def _all_sampler_logp(self, got: Collected) -> jax.Array:
        """The sampler's log-probs f32 [N, length] of all rows of `got`, uploaded once."""
        if got.sampler_logp is None:
            got.sampler_logp = self._sampler_logp(got.host)
        return got.sampler_logp

    def _sampler_logp(self, host, rows: np.ndarray | None = None) -> jax.Array:
        """The sampler's log-probs f32 [M, length] of `rows` (default all), on the mesh."""
        logp = host["sampler_logp"][:, :host["length"]]
        return self.rt.put(logp if rows is None else logp[rows])

    # ------------------------------------------------------------------ shape, advantages

    def shape_rewards(self, got: Collected) -> tuple[np.ndarray, jax.Array | None, dict]:
        """Shape-rewards phase: the KL in the reward (`rl.kl_in_reward` with a reference;
        the format and length terms are already in `got.rewards.total`, from the reward pool).

        Returns (seq_rewards f32 [N] host, kl, metrics): per sequence, the rewards minus beta
        times the sampler's sequence KL to the reference, kl None and "reward/kl_penalty" (its
        mean); per token (the critic), the rewards as they are and kl f32 [N, L] on the mesh,
        the per-token KL for its token rewards. Without KL in the reward: (total, None, {}).
        """
        rl, total = self.rl, got.rewards.total
        if self.kl_in_reward is None:
            return total, None, {}
        logp = self._all_sampler_logp(got)
        if self.kl_in_reward == "token":
            return total, kl_penalty(logp, got.ref_logp, estimator=rl.kl_estimator), {}
        penalty = np.asarray(distributed.to_host(kl_reward_penalty(
            logp, got.ref_logp, self._full_rollout(got).mask, beta=self.beta,
            estimator=rl.kl_estimator)), np.float32)
        return total - penalty, None, {"reward/kl_penalty": float(np.mean(penalty))}

    def advantages(self, got: Collected, seq_rewards: np.ndarray,
                   kl: jax.Array | None) -> dict[str, Any]:
        """Advantages phase: the critic's GAE (`Critic.advantages`, with the token KL `kl`),
        or the group estimator of the registry (`rl.advantage_estimator`, its scale) on
        `seq_rewards` (f32 [N] host).

        Returns {"advantages": f32 [N] host, 0 on rows the loss does not see} from the
        registry; {"advantages", "old_values", "returns"} f32 [N, L] on the mesh from the
        critic.
        """
        lengths = self.train_lengths(got.host)
        return self.advantage_source.advantages(
            seq_rewards, lambda: self._full_rollout(got), kl, self.beta, lengths,
            packs=lambda: self.packed.all_packs(got, lengths))

    # ------------------------------------------------------------------ update

    def update_batch(self, got: Collected, targets: dict[str, Any]) -> tuple[dict, int]:
        """Update-batch phase: the rows to train on, their `targets` (from `advantages`; host
        arrays are put on the mesh), the whole batch's normalizers and the log-probs the loss
        reads. With `skip_rows` only the rows with a nonzero advantage, padded to a bucket
        (`select_train_rows`, a multiple of micro-batches x data-parallel size); else all N.
        With rl.packing all N rows, those not trained on with an all-zero mask, and their
        packs (the `update.PACK_KEYS`), from which the update's log-probs come.

        Returns (batch, train_rows): batch holds the `Rollout` fields ([M, ...]), the
        targets, num_sequences f32 [] (N), num_tokens f32 [] (the policy's tokens of all N
        rows: a subset of rows gives the whole batch's loss), beta f32 [], sampler_logp f32
        [M, L], ref_logp f32 [N, L] with a reference and old_logp f32 [M, L] with
        `rl.num_iterations` > 1; train_rows is the number of real rows among the M.
        """
        rl, host, keep = self.rl, got.host, None
        if self.packed is not None:  # every row: those not trained on read nothing
            keep = np.asarray(targets["advantages"]) != 0 if self.skip_rows else None
            rollout = self._full_rollout(got) if keep is None else self.rollout(host, None, keep)
            sampler_logp = self._all_sampler_logp(got)
            train_rows = got.num_rows if keep is None else int(keep.sum())
        elif self.skip_rows:
            rows, real = select_train_rows(
                targets["advantages"], rl.train_row_buckets,
                rl.micro_batches * shd.data_parallel_size(self.rt.mesh, self.rt.rules))
            rollout, sampler_logp = self.rollout(host, rows, real), self._sampler_logp(host, rows)
            targets = {"advantages": np.where(real, targets["advantages"][rows],
                                              0.0).astype(np.float32)}
            train_rows = int(real.sum())
        else:
            rollout, sampler_logp = self._full_rollout(got), self._all_sampler_logp(got)
            train_rows = got.num_rows
        lengths = self.train_lengths(host)
        # Tokens are the policy's own (tool results carry no loss).
        policy_tokens = (np.sum(lengths) if "tool_mask" not in host else
                         tool_loss_mask(lengths, host["length"], host["tool_mask"]).sum())
        batch = {**vars(rollout), **{name: self.rt.put(x) if isinstance(x, np.ndarray) else x
                                     for name, x in targets.items()}}
        batch.update(num_sequences=np.float32(got.num_rows),
                     num_tokens=np.float32(max(1, policy_tokens)),
                     beta=np.float32(self.beta), sampler_logp=sampler_logp)
        if got.ref_logp is not None:
            batch["ref_logp"] = got.ref_logp
        if self.packed is not None:
            batch.update(self.packed.batch_packs(got, lengths, keep))
        if rl.num_iterations > 1:
            batch["old_logp"] = self.logprobs.of_batch(self.state.params, rollout, batch)
        return batch, train_rows

    def update(self, batch: dict[str, Any]) -> dict[str, float]:
        """Update phase: `rl.num_iterations` donated updates of the policy (its optimizer
        state on the chips meanwhile) and of the critic on `batch`; the policy stays frozen
        during the critic's warm-up. Then the adaptive KL coefficient and the reference sync.
        Returns the last update's metrics as host floats, with "beta"."""
        source, metrics = self.advantage_source, {}
        trains_policy = source.trains_policy(self.step_count)
        self.state = self._onload_optimizer(self.state)
        for _ in range(self.rl.num_iterations):
            if trains_policy:
                self.state, metrics = self.update_fn(self.state, batch)
            metrics = {**metrics, **source.update(batch)}
        self.state = self._offload_optimizer(self.state)
        self.step_count += 1
        metrics = {k: float(v) for k, v in distributed.to_host(metrics).items()}
        self._after_update(metrics)
        return metrics

    def _skip_update(self, got: Collected, t0: float) -> dict[str, float]:
        """A step without an update (every reward non-finite): its metrics, and the batch
        recorded in `skipped_batch` for the skip guard."""
        got.times["time/train_s"] = time.time() - t0
        self.skipped_batch = ("every reward non-finite", [e.get("id") for e in got.examples])
        self.step_count += 1
        return {"update_skipped": 1.0,
                **rollout_metrics(got.rewards, got.host, self.rl.num_generations,
                                  self.verifier, got.examples),
                **got.metrics, **got.times}

    def _after_update(self, metrics: dict[str, float]) -> None:
        """Adaptive KL coefficient and reference sync, once per step (host side)."""
        rl = self.rl
        step = int(self.state.step) // rl.num_iterations
        if self.ref_params is not None and rl.kl_target > 0 and "kl" in metrics:
            self.beta = adaptive_kl_beta(self.beta, metrics["kl"], rl.kl_target, rl.kl_horizon,
                                         rl.batch_prompts * rl.num_generations)
        metrics["beta"] = self.beta
        if self.ref_params is not None and rl.ref_sync_every > 0 and step % rl.ref_sync_every == 0:
            mixed = mix_reference(self._reference(), self.state.params, rl.ref_sync_alpha)
            self.ref_params = (shd.to_memory(mixed, "pinned_host")
                               if rl.get("offload_reference", False) else mixed)

    # ------------------------------------------------------------------ metrics

    def step_metrics(self, got: Collected, update_metrics: dict[str, float],
                     shaping: dict[str, float], train_rows: int) -> dict[str, float]:
        """Metrics phase: the update's (with "beta"), train_rows_frac (rows with a nonzero
        advantage / N), the reward shaping's, the rollout's (`rollout_metrics`), dynamic
        sampling's and the phase times; every value a float."""
        update_metrics["train_rows_frac"] = train_rows / got.num_rows
        return {**update_metrics, **shaping,
                **rollout_metrics(got.rewards, got.host, self.rl.num_generations,
                                  self.verifier, got.examples),
                **got.metrics, **got.times}

    # ------------------------------------------------------------------ the loop

    def run(self, resume: bool = True) -> Any:
        """Runs the remaining RL steps; returns the final params."""
        rl, cfg = self.rl, self.rt.config
        if resume:
            self.restore()
        start = self.step_count
        self.writer.truncate("rl", after_step=start)  # a resumed run rewrites these steps
        guard = SkipGuard("rl", cfg.guards.max_consecutive_skips)
        with ProgressBar(rl.steps, f"rl/{rl.algorithm}", enabled=cfg.log.progress_bar) as bar:
            bar.update(start)
            for step in range(start + 1, rl.steps + 1):
                self.skipped_batch = None
                if self.queue is not None:
                    metrics, examples = self.step_ahead(step)
                else:
                    examples = (next(self.data) if self.partial is None
                                or self.partial.wants_examples() else [])
                    metrics = self.step(examples)
                self.writer.write(step, metrics, phase="rl")
                bar.update(1, format_line(step, metrics, keys=("reward/mean", "accuracy", "kl",
                                                               "completion/length_mean")))
                why, ids = self.skipped_batch or ("non-finite loss or gradient",
                                                  [e.get("id") for e in examples])
                guard.update(step, metrics.get("update_skipped", 0) > 0, why, ids)
                if step % cfg.checkpoint.every_steps == 0 or step == rl.steps \
                        or stop_requested():
                    self.save(step)
                if stop_requested() and step < rl.steps:
                    self.rewards.close()
                    self.ckpt.close()
                    raise Preempted("rl", step)
        self.rewards.close()
        self.ckpt.close()
        return self.state.params
