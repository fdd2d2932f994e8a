"""GRPO on procedurally generated multi-digit arithmetic: the default CPU run (R1 recipe).

    jaxrl-reason train --config configs/arith_grpo.py
    jaxrl-reason train --config configs/arith_grpo.py:smoke       # seconds, for tests
    jaxrl-reason train --config configs/arith_grpo.py --config.rl.beta=0.04

Pipeline: train a task tokenizer -> cold-start SFT on a few thousand worked traces ->
GRPO with correctness + format rewards -> evaluation (pass@k, maj@k over seeds) of the SFT
and the RL checkpoints on held-out problems of the training levels and of one level above.

Departures from DeepSeekMath's GRPO (Shao et al., 2024):
  - one policy update per batch by default (num_iterations=1), so the clipped ratio is 1 at
    the update and the objective reduces to the group-normalized policy gradient, as in
    TRL's default;
  - token-level aggregation is the paper's per-sequence mean ("grpo" loss_type);
  - no KL penalty by default (beta = 0, as Dr. GRPO and DAPO): at this learning rate a k3 KL
    with beta = 0.01 measured no better, and without it the frozen reference pass is skipped
    and the update runs only on rows with a nonzero advantage (rl.skip_zero_advantage_rows),
    about 40% less training compute. `--config.rl.beta=0.04` restores the paper's KL term.
"""

import ml_collections

from jaxrl_reason.models.config import get_preset


def _model(preset: str) -> ml_collections.ConfigDict:
    fields = dict(get_preset(preset).__dict__)
    fields["vocab_size"] = 0  # 0 = take the size of the run's tokenizer
    return ml_collections.ConfigDict(fields)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    smoke = arg == "smoke"
    if arg not in (None, "", "smoke"):
        raise ValueError(f"arith_grpo: unknown config argument {arg!r}; use ':smoke' or nothing")
    c = ml_collections.ConfigDict()
    c.name = "arith_grpo"                   # run name; default workdir is runs/<name>
    c.seed = 0                              # seeds params, data order and sampling
    c.model = _model("test" if smoke else "tiny")  # decoder hyper-parameters (ModelConfig)
    # A Hugging Face model directory to start from instead of a cold-start SFT: its
    # config.json gives the architecture (only the model block's dtype/remat/log-prob/
    # attention-chunk knobs apply), its safetensors the weights, its files the tokenizer.
    c.hf_model = ""

    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1                        # data-parallel axis (-1: all remaining devices)
    c.mesh.fsdp = 1                         # parameter/optimizer sharding axis
    c.mesh.tensor = 1                       # tensor-parallel axis
    c.mesh.context = 1                      # context parallelism: splits the packed sequence
    # On a CPU host: XLA devices to split it into (0 = auto: one per core, as many as the
    # batches split over; 1 = one device). Per-core devices run each core's rows as its own
    # program: faster for small models, a copy of the weights each (README "CPU devices").
    c.cpu_devices = 0
    # Logical axis -> mesh axes. Layers only name logical axes.
    c.sharding_rules = (
        ("batch", ("data", "fsdp")),        # examples over data and fsdp
        ("embed", ("fsdp", "context")),     # weights' model dim over fsdp x context (ZeRO-3)
        ("mlp", "tensor"), ("heads", "tensor"), ("kv_heads", "tensor"), ("vocab", "tensor"),
        ("length", "context"),              # training activations' sequence over context
    )

    c.tokenizer = ml_collections.ConfigDict()
    c.tokenizer.path = ""                   # an existing sentencepiece .model; "" = train one
    c.tokenizer.vocab_size = 320            # size of the tokenizer trained on the task corpus
    c.tokenizer.corpus_examples = 2000      # task examples the tokenizer is trained on

    c.task = ml_collections.ConfigDict()
    c.task.name = "arithmetic"              # built-in task
    c.task.train_levels = (1, 2, 3)         # difficulty levels used for SFT and RL
    c.task.eval_levels = ((1, 2, 3), (4,))  # evaluation sets: held-out in-range, one above
    c.task.prompt_buckets = (16, 32)        # prompt lengths (tokens) programs are compiled for
    c.task.length_targets = (0, 0)          # L1/LCPO token budgets (low, high) per prompt; (0, 0): off

    c.sft = ml_collections.ConfigDict()
    c.sft.num_examples = 64 if smoke else 3000   # cold-start traces (a true cold start)
    c.sft.steps = 4 if smoke else 400       # optimizer steps (about 4 epochs)
    c.sft.batch_size = 16 if smoke else 32  # sequences per step
    c.sft.learning_rate = 2e-3              # peak AdamW learning rate
    c.sft.warmup_steps = 1 if smoke else 30 # linear warm-up, then cosine decay to 10%
    c.sft.weight_decay = 0.01               # AdamW weight decay
    c.sft.max_grad_norm = 1.0               # global-norm gradient clipping
    c.sft.max_completion_length = 96        # longest completion (tokens incl. EOS)
    c.sft.length_bucket = 16                # batches pad completions to a multiple of this
    c.sft.micro_batches = 1                 # gradient accumulation: rows (or packs) in k parts
    c.sft.packing = False                   # padding-free packs (docs/packing.md)
    c.sft.pack_tokens = 256                 # tokens per pack: >= prompt + completion - 1

    c.rl = ml_collections.ConfigDict()
    c.rl.algorithm = "grpo"                 # name for logs; the pieces below define it
    c.rl.steps = 2 if smoke else 200        # RL steps (one batch of rollouts each)
    c.rl.batch_prompts = 4 if smoke else 16  # prompts per step (B)
    c.rl.num_generations = 4 if smoke else 8  # samples per prompt (G)
    c.rl.max_new_tokens = 32 if smoke else 96  # completion budget (L)
    c.rl.temperature = 1.0                  # rollout temperature
    c.rl.top_p = 1.0                        # rollout nucleus
    c.rl.top_k = 0                          # rollout top-k (0 = off)
    c.rl.max_num_seqs = 0                   # > 0: slot refill, rows decoded in this many slots
    c.rl.refill_every = 8                   # slot refill: decode steps between refills
    c.rl.refill_min_slots = 4               # slot refill: fewest slots the tail shrinks to (0: never)
    c.rl.rollout_token_budget = 0           # > 0: partial rollouts, decode steps per row per step
    c.rl.max_rollout_age = 4                # partial rollouts: steps a pending row may wait
    c.rl.max_staleness = 0                  # > 0: batches sampled up to k policy versions ahead
    c.rl.learning_rate = 5e-5               # AdamW learning rate (constant after warm-up)
    c.rl.warmup_steps = 0 if smoke else 10  # linear warm-up steps
    c.rl.lr_decay = "constant"              # after warm-up: constant | cosine (to 10%)
    c.rl.weight_decay = 0.0                 # AdamW weight decay
    c.rl.max_grad_norm = 1.0                # global-norm gradient clipping
    c.rl.num_iterations = 1                 # policy updates per batch (mu in the GRPO paper)
    c.rl.micro_batches = 1                  # gradient accumulation: rows split into k micro-batches
    c.rl.offload_reference = False          # frozen reference in host memory outside its log-prob pass
    c.rl.offload_optimizer = False          # optimizer state in host memory outside the update
    c.rl.advantage_estimator = "grpo"       # grpo | rloo | reinforce_pp | passk | gae (PPO critic)
    c.rl.advantage_scale = "group"          # group | batch | none (none + grpo = Dr. GRPO)
    c.rl.passk_k = 0                        # passk: pass@k's k, 1..num_generations (0: unset)
    c.rl.loss_type = "grpo"                 # grpo | bnpo | dr_grpo | dapo
    c.rl.epsilon_low = 0.2                  # lower clip range
    c.rl.epsilon_high = 0.2                 # upper clip range (DAPO clip-higher: 0.28)
    c.rl.beta = 0.0                         # KL coefficient to the SFT reference (0: no reference)
    c.rl.kl_in_reward = False               # True: subtract beta * KL from the reward, not the loss
    c.rl.policy_loss_mode = "ppo"           # ppo (token ratio) | gspo (sequence ratio) | cispo
    c.rl.clip_ratio_c = 0.0                 # dual-clip bound for negative advantages (> 1); 0 = off
    c.rl.tis_cap = 0.0                      # truncated IS weight vs sampler log-probs; 0 = off
    c.rl.entropy_coef = 0.0                 # entropy bonus coefficient
    c.rl.kl_estimator = "k3"                # k1 | k2 | k3
    c.rl.kl_target = 0.0                    # > 0: adaptive KL controller aims beta at this KL
    c.rl.kl_horizon = 10000.0               # adaptive KL horizon (samples)
    c.rl.ref_sync_every = 0                 # > 0: mix the reference toward the policy every k steps
    c.rl.ref_sync_alpha = 1.0               # reference sync mixing rate (1 = copy the policy)
    c.rl.dynamic_sampling = False           # DAPO: resample until B groups have reward variance
    c.rl.dynamic_sampling_max_rounds = 3    # extra sampling rounds per step at most
    c.rl.mask_truncated_completions = False  # truncated samples give no gradient (DAPO)
    c.rl.gamma = 1.0                        # GAE discount (advantage_estimator = gae)
    c.rl.lam = 0.95                         # GAE lambda
    c.rl.whiten_advantages = True           # GAE: whiten advantages over the batch's tokens
    c.rl.value = ml_collections.ConfigDict()  # PPO critic (advantage_estimator = gae)
    c.rl.value.init = "policy"              # policy | sft | random: where the trunk starts
    c.rl.value.learning_rate = 2e-4         # critic AdamW learning rate
    c.rl.value.clip_range = 0.2             # clipped value loss range (0 = unclipped)
    c.rl.value.warmup_steps = 0             # steps that train only the critic
    c.rl.value.weight_decay = 0.0
    c.rl.value.max_grad_norm = 1.0
    c.rl.train_length_bucket = 32           # training pads completions to a multiple of this
    c.rl.skip_zero_advantage_rows = True    # beta = 0: update only on rows with a signal
    c.rl.train_row_buckets = 4              # row counts the update compiles for (N*k/4)
    c.rl.packing = False                    # padding-free packs for log-prob passes + update
    c.rl.pack_tokens = 256 if smoke else 512  # tokens per pack (docs/packing.md)

    c.rewards = ml_collections.ConfigDict()
    c.rewards.weights = ml_collections.ConfigDict({"correctness": 1.0, "format_strict": 0.1})
    # Keyword options per reward, used when that reward is weighted (see jaxrl_reason.rewards).
    c.rewards.options = ml_collections.ConfigDict({
        "length_l1_exact": {"alpha": 3e-4},                  # L1-Exact: -alpha*|n_gold - n|
        "length_l1_max": {"alpha": 3e-4, "delta": 0.5},      # L1-Max
        "length_cosine": {"correct_short": 2.0, "correct_long": 1.0, "wrong_short": -10.0,
                          "wrong_long": 0.0, "exceed": -10.0},  # Yeo et al. cosine reward
        "overlong_dapo": {"cache_length": 0},                # DAPO soft window; 0 = L/4
        # the math verifier (math-verify's options; also used by eval and distill):
        # decimals equal after rounding to float_rounding places; strict: variables matter,
        # a set is not a tuple; targets: "latex", "expr" (plain expressions), "string";
        # set_relation: an inequality may equal an interval
        "correctness": {"float_rounding": 6, "numeric_precision": 15, "strict": True,
                        "targets": ("latex", "expr"), "set_relation": True},
    })
    c.rewards.modules = ()                  # modules / .py files registering user rewards
    c.rewards.num_workers = 2               # host threads scoring completions
    # Limits charged to each answer, not to the batch: a reward call may use timeout_s
    # seconds of its own CPU time ("<name>/timeout", a legitimate 0); one still running
    # backstop_factor * timeout_s seconds of wall time is abandoned as unscored (logged as
    # rewards/unscored in RL; retried, then counted, in evaluation).
    c.rewards.timeout_s = 5.0
    c.rewards.backstop_factor = 10.0
    # A trained reward model (`jaxrl-reason reward-model` workdir) as one more component,
    # "reward/reward_model", scored on the device on the run's mesh; "" = none.
    c.rewards.reward_model_dir = ""
    c.rewards.reward_model_weight = 0.0     # its weight in the total (0: scored and logged only)
    c.rewards.reward_model_normalize = True  # standardize by the held-out mean/std saved with it

    c.eval = ml_collections.ConfigDict()
    c.eval.num_problems = 16 if smoke else 200  # held-out problems per evaluation set
    c.eval.num_samples = 2 if smoke else 4  # samples per problem (n); pass@k for k <= n
    c.eval.seeds = (0, 1) if smoke else (0, 1, 2)  # sampling seeds (mean and 95% interval)
    c.eval.temperature = 1.0                # sampling temperature of the evaluation
    c.eval.top_p = 1.0
    c.eval.max_new_tokens = 32 if smoke else 128  # budget (covers the level above training)
    c.eval.batch_prompts = 16 if smoke else 50  # prompts per sampler call
    c.eval.data_seed = 1234                 # seed of the held-out problem sets
    # Test-time compute: maj@k / best_of@k for k < n average over this many random k-subsets
    # of the n samples; best_of@k keeps the samples this reward (no reference answer) scores
    # highest, then votes; equivalent answers ("0.5", "1/2") vote together; plot draws the
    # accuracy-vs-samples curves next to eval.json (matplotlib).
    c.eval.vote_subsets = 64
    c.eval.best_of_verifier = "format_strict"
    c.eval.answer_equivalence = True
    c.eval.plot = False
    # An answer left without a verdict (a CPU timeout, or unscored at the wall-clock
    # backstop) is scored again with limits this many times longer; the evaluation fails
    # when more than this share of its answers stays unscored (0: any).
    c.eval.retry_limit_factor = 4.0
    c.eval.max_unscored_share = 0.0

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 2 if smoke else 25  # save period (steps) in each phase
    c.checkpoint.max_to_keep = 2            # checkpoints kept per phase

    c.kernels = ml_collections.ConfigDict()
    c.kernels.backend = "auto"              # auto (Pallas on TPU) | pallas | reference

    # Multi-host (see README "Multi-host"): jax.distributed.initialize before anything else.
    c.distributed = ml_collections.ConfigDict()
    c.distributed.enabled = "auto"          # auto (TPU VM/pod, or an address/count given) | true | false
    c.distributed.coordinator_address = ""  # "host:port" of process 0; "" = $JAX_COORDINATOR_ADDRESS or detect
    c.distributed.num_processes = 0         # processes in the job; 0 = $JAX_NUM_PROCESSES or detect
    c.distributed.process_id = -1           # this process's index; -1 = $JAX_PROCESS_ID or detect
    c.distributed.local_device_ids = ()     # devices of this process; () = all (or JAX's choice)
    c.distributed.initialization_timeout = 300  # seconds to wait for every process to join
    # Multi-slice: slices (TPU; hosts elsewhere) each mesh axis spans over the data-center
    # network; the `mesh` sizes above stay global. All 1: one slice (ICI only).
    c.distributed.dcn_mesh = ml_collections.ConfigDict(
        {"data": 1, "fsdp": 1, "tensor": 1, "context": 1})

    c.guards = ml_collections.ConfigDict()
    c.guards.max_consecutive_skips = 5      # stop after this many non-finite updates in a row

    c.log = ml_collections.ConfigDict()
    c.log.tensorboard = True                # write tensorboard events under <workdir>/tb
    c.log.wandb = False                     # also log to Weights & Biases ([wandb] extra)
    c.log.wandb_project = "jaxrl-reason"    # the W&B project
    c.log.wandb_entity = ""                 # team or user; "" = the account's default
    c.log.wandb_name = ""                   # run name; "" = the workdir's basename
    c.log.wandb_mode = "online"             # online | offline (local run dir; `wandb sync`)
    c.log.wandb_dir = ""                    # local dir for wandb's files; "" = the workdir
    c.log.progress_bar = True               # tqdm-style bar per phase on the console
    return c
