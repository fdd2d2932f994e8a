"""The RL loop: sample -> score -> advantages -> update -> log, one screen per step.

Algorithms (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++) differ only in the config fields that
name the advantage estimator, its scale, the loss aggregation, the clip range and the KL
estimator; there is one trainer.

Per step, with B prompts and G samples each (N = B * G rows, group-major):
  1. sampler (jit, on the mesh, live params) -> tokens [N, L], lengths, sampler log-probs
  2. dispatch reference (and, for num_iterations > 1, old-policy) log-probs on the device
  3. meanwhile, host threads decode and verify the completions -> rewards [N]
  4. group advantages [N]; `num_iterations` jitted, donated updates of the clipped loss
  5. metrics to tensorboard, console and metrics.jsonl; checkpoint every k steps

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

from jaxrl_reason import distributed
from jaxrl_reason import sharding as shd
from jaxrl_reason.data.pipeline import example_iterator
from jaxrl_reason.metrics import MetricsWriter, format_line
from jaxrl_reason.progress import ProgressBar
from jaxrl_reason.reliability import Preempted, SkipGuard, stop_requested
from jaxrl_reason.rewards.pool import BatchRewards, make_reward_pool
from jaxrl_reason.rl import backends as kernel_dispatch
from jaxrl_reason.rl.batches import (Rollout, merge_groups, select_train_rows,
                                     zero_variance_groups)
from jaxrl_reason.rl.losses import kl_penalty, kl_reward_penalty
from jaxrl_reason.rl.rm_reward import load_reward_component
from jaxrl_reason.rl.value import init_value_params, make_value_fn, make_value_update_fn
from jaxrl_reason.run_state import PhaseCheckpointer
from jaxrl_reason.data.tasks import task_source, task_verifier
from jaxrl_reason.evaluation import domain_metrics
from jaxrl_reason.runtime import Runtime
from jaxrl_reason.sampling.sampler import round_up
from jaxrl_reason.sampling.tools import ToolSampleOutput, tool_loss_mask
from jaxrl_reason.rl.update import (adaptive_kl_beta, make_logprob_fn, make_update_fn,
                                    mix_reference, ppo_advantages)
from jaxrl_reason.train_state import (TrainState, create_train_state, learning_rate_schedule,
                                      make_optimizer)

TRAIN_SIZE = 10_000_000  # the procedurally generated training set is effectively unbounded


class RLTrainer:
    """GRPO-family trainer on one mesh. `run()` executes `config.rl.steps` steps.

    `init_params` become the policy's training state and their buffers are donated to the
    first update (copy them first if the caller needs them afterwards); with beta > 0 a
    separate frozen copy is kept as the reference (or `ref_params` when given). With
    `num_iterations > 1`, `step()` reports the metrics of the last update of the batch.
    """

    def __init__(self, rt: Runtime, writer: MetricsWriter, *, init_params, ref_params=None):
        self.rt, self.writer, self.rl = rt, writer, rt.config.rl
        rl = self.rl
        self.optimizer = make_optimizer(
            learning_rate_schedule(rl.learning_rate, rl.warmup_steps, rl.steps,
                                   rl.lr_decay),
            weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm)
        self.state = self._offload_optimizer(create_train_state(init_params, self.optimizer))
        # The frozen reference: a separate copy (the policy's buffers are donated), in host
        # memory between its log-prob passes with rl.offload_reference.
        self.ref_params = None
        self.beta = float(rl.beta)  # the KL coefficient; moves with an adaptive KL target
        if rl.beta > 0:
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
        # Zero-advantage rows carry no loss term only without the KL penalty (and never with
        # per-token GAE advantages).
        self.gae = rl.advantage_estimator == "gae"
        self.skip_rows = bool(rl.skip_zero_advantage_rows) and rl.beta == 0 and not self.gae
        self.value_state = None
        self.step_count = 0  # RL steps taken by this trainer (restored with the state)
        self.skipped_batch = None  # (why, example ids) when `step` skipped its update
        if self.gae:  # PPO's critic, before the first update donates `init_params`
            self._init_critic(init_params, ref_params)
        self.logprob_fn = make_logprob_fn(rt.model, rl.temperature, rl.micro_batches,
                                          rt.mesh, rt.rules)
        self.kernel_backend = rt.config.get("kernels", {}).get("backend", "auto")
        self.update_fn = make_update_fn(rt.model, self.optimizer, rl, rt.mesh, rt.rules,
                                        self.kernel_backend)
        self.ckpt = PhaseCheckpointer(rt, "rl")

    def _init_critic(self, init_params, sft_params) -> None:
        """The value model (policy trunk + scalar head) and its own optimizer."""
        rt, v = self.rt, self.rl.value
        source = {"policy": init_params, "sft": sft_params if sft_params is not None
                  else init_params, "random": None}[v.init]
        self.value_optimizer = make_optimizer(
            learning_rate_schedule(v.learning_rate, self.rl.warmup_steps, self.rl.steps,
                                   "constant"),
            weight_decay=v.weight_decay, max_grad_norm=v.max_grad_norm)
        value_params = init_value_params(rt.model_cfg, jax.random.key(rt.config.seed + 2),
                                         rt.mesh, rt.rules, from_params=source)
        self.value_state = create_train_state(value_params, self.value_optimizer)
        self.value_fn = make_value_fn(rt.model, rt.mesh, rt.rules)
        self.value_update_fn = make_value_update_fn(
            rt.model, self.value_optimizer, clip_range=v.clip_range or None,
            loss_type="bnpo", max_completion_length=self.rl.max_new_tokens,
            mesh=rt.mesh, rules=rt.rules)

    # ------------------------------------------------------------------ host offload

    def _reference(self):
        """The reference params on the chips (a transient copy when they live in host
        memory: it is freed once the log-prob pass that reads it is done)."""
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
        if self.ref_params is not None:
            extra["ref_params"] = self.ref_params
        if self.value_state is not None:
            extra["value_state"] = {"step": self.value_state.step,
                                    "params": self.value_state.params,
                                    "opt_state": self.value_state.opt_state}
        return extra

    def save(self, step: int) -> None:
        self.ckpt.save(step, self.state, self.data.get_state(), extra=self._extra(),
                       extra_meta={"beta": self.beta, "step": step})

    def restore(self) -> bool:
        """Continues from the newest complete RL checkpoint; False when there is none."""
        restored = self.ckpt.restore_latest(self.state, self._extra())
        if restored is None:
            return False
        self.state, meta, extra = restored
        # The loop's step (skipped updates leave the optimizer's step count behind).
        self.step_count = int(meta.get("step", int(self.state.step) // self.rl.num_iterations))
        self.data.set_state(meta["data_iterator"])
        self.beta = float(meta.get("beta", self.rl.beta))
        self.rng = jax.random.wrap_key_data(extra["rng"])
        if self.ref_params is not None:
            self.ref_params = extra["ref_params"]
        if self.value_state is not None:
            self.value_state = TrainState(**extra["value_state"])
        return True

    # ------------------------------------------------------------------ one step

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
        shared = rows is None and not self.gae
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

    def collect(self, examples, rng) -> tuple[list, dict, BatchRewards, dict[str, float]]:
        """Samples and scores `examples`; with `rl.dynamic_sampling` (DAPO) keeps drawing
        batches of prompts until B groups have rewards that are not all equal, or
        `rl.dynamic_sampling_max_rounds` extra rounds were drawn (the batch is then topped up
        with zero-variance groups, which add nothing to the loss). Returns the B examples,
        their host arrays (see `generate`), rewards and the dynamic-sampling metrics."""
        rl = self.rl
        host = self.generate(examples, rng)
        rewards = self.agreed(self.score(examples, host).result())
        if not rl.dynamic_sampling:
            return list(examples), host, rewards, {}
        g, b = rl.num_generations, rl.batch_prompts
        parts = [(list(examples), host, rewards)]
        rounds = 0

        def informative():
            return sum(int((~zero_variance_groups(r.total, g)).sum()) for _, _, r in parts)

        while informative() < b and rounds < rl.dynamic_sampling_max_rounds:
            rounds += 1
            more = next(self.data)
            more_host = self.generate(more, jax.random.fold_in(rng, rounds))
            parts.append((list(more), more_host,
                          self.agreed(self.score(more, more_host).result())))
        flat = [(part, k) for part, (_, _, r) in enumerate(parts)
                for k in np.flatnonzero(~zero_variance_groups(r.total, g))]
        informative = len(flat)
        if informative < b:  # the cap was hit: top up with zero-variance groups
            flat += [(0, k) for k in np.flatnonzero(zero_variance_groups(parts[0][2].total, g))]
        drawn = sum(len(e) for e, _, _ in parts)
        metrics = {"dynamic_sampling/extra_rounds": float(rounds),
                   "dynamic_sampling/zero_variance_groups": float(drawn - informative),
                   "dynamic_sampling/filled_groups": float(max(0, b - informative))}
        return (*merge_groups(parts, flat[:b], g, self.rl.train_length_bucket,
                              self.rl.max_new_tokens), metrics)

    def step(self, examples) -> dict[str, float]:
        rl, times = self.rl, {}
        self.rng, sample_rng = jax.random.split(self.rng)

        t0 = time.time()
        if rl.dynamic_sampling:  # rows are only known after scoring: no overlap possible
            examples, host, rewards, ds_metrics = self.collect(examples, sample_rng)
            times["time/sample_s"], t0 = time.time() - t0, time.time()
            rollout = self.rollout(host) if self.ref_params is not None else None
            ref_logp = (None if rollout is None else
                        self.logprob_fn(self._reference(), *rollout.scoring_args()))
        else:
            ds_metrics = {}
            host = self.generate(examples, sample_rng)
            times["time/sample_s"] = time.time() - t0
            # Device work first (asynchronous dispatch), then host scoring while it runs.
            t0 = time.time()
            rollout, ref_logp = None, None
            if self.ref_params is not None:  # every row carries the KL term: none skipped
                rollout = self.rollout(host)
                ref_logp = self.logprob_fn(self._reference(), *rollout.scoring_args())
            rewards = self.agreed(self.score(examples, host).result())
        times["time/score_s"] = time.time() - t0

        t0 = time.time()
        train_lengths = self.train_lengths(host)
        num_rows = train_rows = len(train_lengths)
        nonfinite = sum(n for reason, n in rewards.reasons.items()
                        if reason.endswith("/nonfinite"))
        if nonfinite >= num_rows:  # every reward NaN/inf: nothing to learn from, skip
            times["time/train_s"] = time.time() - t0
            self.skipped_batch = ("every reward non-finite", [e.get("id") for e in examples])
            self.step_count += 1
            return {"update_skipped": 1.0, **self._rollout_metrics(rewards, host, examples),
                    **ds_metrics, **times}
        if rollout is None and (self.gae or not self.skip_rows):
            rollout = self.rollout(host)
        seq_rewards, extra_metrics = rewards.total, {}
        # The sampler's log-probs of all rows, uploaded once (KL in the reward, TIS/sampler_kl).
        all_sampler_logp = self._sampler_logp(host) if rollout is not None else None
        if rl.kl_in_reward and ref_logp is not None and not self.gae:
            # Sequence KL of the sampling policy to the reference, taken off the reward.
            penalty = np.asarray(distributed.to_host(kl_reward_penalty(
                all_sampler_logp, ref_logp, rollout.mask, beta=self.beta,
                estimator=rl.kl_estimator)), np.float32)
            seq_rewards = seq_rewards - penalty
            extra_metrics["reward/kl_penalty"] = float(np.mean(penalty))
        if self.gae:
            values = self.value_fn(self.value_state.params, *rollout.scoring_args())
            kl = None
            if rl.kl_in_reward and ref_logp is not None:
                kl = kl_penalty(all_sampler_logp, ref_logp, estimator=rl.kl_estimator)
            advantages, returns = ppo_advantages(
                self.rt.put(np.asarray(seq_rewards, np.float32)), rollout.mask, values, kl,
                jnp.float32(self.beta), gamma=rl.gamma, lam=rl.lam,
                whiten_advantages=rl.whiten_advantages)
            batch = {**vars(rollout), "advantages": advantages, "old_values": values,
                     "returns": returns}
            rows = None
        else:
            advantages = np.asarray(distributed.to_host(kernel_dispatch.group_advantages(
                jnp.asarray(seq_rewards), rl.num_generations,
                estimator=rl.advantage_estimator, scale=rl.advantage_scale,
                backend=self.kernel_backend)), np.float32)
            advantages = np.where(train_lengths > 0, advantages, 0.0).astype(np.float32)
            rows = None
            if self.skip_rows:
                rows, real = select_train_rows(
                    advantages, rl.train_row_buckets,
                    rl.micro_batches * shd.data_parallel_size(self.rt.mesh, self.rt.rules))
                rollout = self.rollout(host, rows, real)
                advantages = np.where(real, advantages[rows], 0.0).astype(np.float32)
                train_rows = int(real.sum())
            batch = {**vars(rollout), "advantages": self.rt.put(advantages)}
        # Whole-batch normalizers: a subset of rows gives the whole batch's loss. Tokens are
        # the policy's own (tool results carry no loss).
        policy_tokens = (np.sum(train_lengths) if "tool_mask" not in host else
                         tool_loss_mask(train_lengths, host["length"], host["tool_mask"]).sum())
        batch.update(num_sequences=np.float32(num_rows),
                     num_tokens=np.float32(max(1, policy_tokens)),
                     beta=np.float32(self.beta),
                     sampler_logp=(all_sampler_logp if rows is None
                                   else self._sampler_logp(host, rows)))
        if ref_logp is not None:
            batch["ref_logp"] = ref_logp
        if rl.num_iterations > 1:
            batch["old_logp"] = self.logprob_fn(self.state.params, *rollout.scoring_args())
        metrics = {}
        policy_frozen = self.gae and self.step_count < rl.value.warmup_steps
        self.state = self._onload_optimizer(self.state)
        for _ in range(rl.num_iterations):
            if not policy_frozen:
                self.state, metrics = self.update_fn(self.state, batch)
            if self.gae:
                self.value_state, value_metrics = self.value_update_fn(self.value_state, batch)
                metrics = {**metrics, **value_metrics}
        self.state = self._offload_optimizer(self.state)
        self.step_count += 1
        metrics = {k: float(v) for k, v in distributed.to_host(metrics).items()}
        self._after_update(metrics)
        times["time/train_s"] = time.time() - t0
        metrics["train_rows_frac"] = train_rows / num_rows  # rows with a nonzero advantage
        return {**metrics, **extra_metrics, **self._rollout_metrics(rewards, host, examples),
                **ds_metrics, **times}

    def _sampler_logp(self, host, rows: np.ndarray | None = None) -> jax.Array:
        """The sampler's log-probs f32 [M, length] of `rows` (default all), on the mesh."""
        logp = host["sampler_logp"][:, :host["length"]]
        return self.rt.put(logp if rows is None else logp[rows])

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

    def _rollout_metrics(self, rewards, host, examples=()) -> dict[str, float]:
        """Batch means of rewards, lengths and verdicts; for a task mixture also per domain
        (`accuracy/<domain>`, `reward/<domain>`, `length/<domain>`, `frac/<domain>`)."""
        zero_variance = zero_variance_groups(rewards.total, self.rl.num_generations)
        lengths = host["lengths"]
        out = {
            "reward/mean": float(np.mean(rewards.total)),
            "reward/std": float(np.std(rewards.total)),
            "frac_zero_variance_groups": float(np.mean(zero_variance)),
            "completion/length_mean": float(np.mean(lengths)),
            "completion/length_max": float(np.max(lengths)),
            "completion/truncated_frac": float(np.mean(host["truncated"])),
        }
        for name, values in rewards.components.items():
            out[f"reward/{name}"] = float(np.mean(values))
        if self.verifier in rewards.components:
            out["accuracy"] = out[f"reward/{self.verifier}"]
        for name in ("format_strict", "format_lenient"):
            if name in rewards.components:
                out["format_rate"] = out[f"reward/{name}"]
        domains = [e.get("domain") for e in examples for _ in range(self.rl.num_generations)]
        if any(domains) and len(domains) == len(rewards.total):
            out.update(domain_metrics(domains, rewards.total,
                                      rewards.components.get(self.verifier), lengths))
        return out

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
                examples = next(self.data)
                self.skipped_batch = None
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
