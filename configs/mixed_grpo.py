"""GRPO on a mixture of domains: arithmetic (math), countdown, knights-and-knaves (logic), code.

    jaxrl-reason train --config configs/mixed_grpo.py
    jaxrl-reason train --config configs/mixed_grpo.py:smoke       # seconds, for tests
    jaxrl-reason train --config configs/mixed_grpo.py \
        --config.task.mixture="(('arithmetic', 1.0), ('code', 1.0, (1, 2)))"

The recipe of configs/arith_grpo.py on a weighted stream of four procedural tasks
(`data/mixture.py`): every training batch draws each prompt's domain by the weights from a
seeded counter-based stream (exactly resumable); one tokenizer is trained on the union of
the four corpora; the cold-start SFT sees the same mixture; each row's reward is its own
domain's verifier (`domain_verifier`: `correctness` for arithmetic, `countdown`,
`knights_knaves`, and `code`, which runs the completion's function against hidden tests in
the sandbox) plus the strict format reward. Every RL step logs `accuracy/<domain>`,
`reward/<domain>`, `length/<domain>` and `frac/<domain>`; evaluation reports each domain's
held-out set of its training levels.

Departures from a single-task run: one completion budget serves every domain, so it is set
by the longest traces (knights-and-knaves level 2, up to ~270 tokens) and the short domains
pay for the padding of the batch they share; a domain's weight sets its share of prompts,
not of tokens or of gradient.
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    smoke = arg == "smoke"
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "mixed_grpo"
    c.task.name = "mixture"                 # several tasks with sampling weights (below)
    # (task, weight[, training levels]); weights are relative; a domain without levels uses
    # task.train_levels. Each domain's held-out set is the eval split of its levels.
    c.task.mixture = (
        ("arithmetic", 0.4),                # math: levels 1-3 (task.train_levels)
        ("countdown", 0.2, (1, 2)),         # two or three numbers
        ("knights_knaves", 0.2, (2,)),      # logic: three people
        ("code", 0.2, (1, 2, 3)),           # one-line Python functions with hidden tests
    )
    c.task.train_levels = (1, 2, 3)         # default levels of a domain that names none
    c.task.eval_levels = ()                 # unused by a mixture (see task.mixture)
    c.task.prompt_buckets = (16, 48, 96)    # arithmetic; code and countdown; knights-knaves
    c.tokenizer.vocab_size = 768            # one vocabulary for the four corpora
    c.tokenizer.corpus_examples = 2000      # per domain: the corpus is their union

    c.sft.num_examples = 64 if smoke else 6000  # cold-start traces, drawn by the weights
    c.sft.steps = 4 if smoke else 600
    c.sft.max_completion_length = 288       # the longest knights-and-knaves trace fits
    c.sft.length_bucket = 32

    c.rl.steps = 2 if smoke else 150
    c.rl.max_new_tokens = 32 if smoke else 288
    c.rl.train_length_bucket = 32

    c.rewards.weights = ml_collections.ConfigDict({"domain_verifier": 1.0,
                                                   "format_strict": 0.1})
    c.rewards.num_workers = 2               # the code sandbox runs ~50 ms per completion
    c.rewards.timeout_s = 30.0              # CPU seconds of one call (a code row's sandbox)

    c.eval.num_problems = 16 if smoke else 100  # held-out problems per domain
    c.eval.max_new_tokens = 32 if smoke else 288
    return c
