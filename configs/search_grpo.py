"""GRPO with tool-use rollouts: questions whose answers exist only in a local corpus.

    jaxrl-reason train --config configs/search_grpo.py
    jaxrl-reason train --config configs/search_grpo.py:smoke      # seconds, for tests

The `search_facts` task (data/search_facts.py) asks about invented countries ("What is the
capital of Vaneva?"); the facts are sentences of a generated corpus that a BM25 search
tool reads. The cold-start SFT shows the tool call in only `task.tool_demo_fraction` of its
traces (the others state the fact from memory), so the SFT model mostly answers from
memory and is mostly wrong. During RL, generation pauses each row at `</search>` (or
`</calc>`), the host runs the tool and appends `<result>...</result>`, and decoding goes on
with the KV cache kept (sampling/tool_loop.py); result tokens are masked out of the loss.
Calling the tool is the way to the reward, so the tool-call rate (`reward/tool_use`,
weighted 0: a metric) and the accuracy rise together: measured (seed 0, 2 shared cores,
21 min) 0.29 -> 0.97 tool calls and 0.09 -> 0.37 reward from the first to the last 10 of
100 steps; held-out pass@1 7.4% -> 36.8%. Evaluation asks about countries that never occur
in training: level 1, one lookup; level 2, lookup + calculator, a chain never trained.

Departures from Search-R1 / ReSearch: a tiny model trained from scratch on a procedural
task; results are appended as a block (`<result>`, not `<information>`) and count toward
the completion budget; one retrieved sentence per search (BM25 top-1, no dense retriever).
"""

import ml_collections

from jaxrl_reason.config.files import sibling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    smoke = arg == "smoke"
    c = sibling_config(__file__, "arith_grpo").get_config(arg)
    c.name = "search_grpo"
    c.tokenizer.vocab_size = 768            # invented names: room for their syllables

    c.task.name = "search_facts"            # the verifier is the "exact_match" reward
    c.task.train_levels = (1,)              # one lookup per question
    c.task.eval_levels = ((1,), (2,))       # held-out countries: lookup; lookup + calculator
    c.task.prompt_buckets = (16, 24)        # "What is the main river of Velmora?" ~ 14 tokens
    c.task.tool_demo_fraction = 0.25        # SFT traces that show the tool call (else: memory)

    c.tools = ml_collections.ConfigDict()
    c.tools.enabled = True                  # rollouts pause at closing tags and run the tools
    c.tools.names = ("search", "calc")      # <search>query</search>, <calc>expression</calc>
    c.tools.search_corpus = "search_facts"  # the task's generated corpus (or a local file)
    c.tools.search_top_k = 1                # sentences per search result
    c.tools.max_calls = 2                   # calls per completion; later tags are text
    c.tools.max_result_tokens = 32          # a result block is cut to this many tokens

    c.sft.num_examples = 64 if smoke else 3000  # cold-start traces
    c.sft.steps = 4 if smoke else 400       # optimizer steps (about 4 epochs)
    c.sft.max_completion_length = 64        # longest trace (tokens incl. EOS): ~55 at level 2

    c.rl.steps = 2 if smoke else 100        # RL steps
    c.rl.max_new_tokens = 32 if smoke else 64  # completion budget, result tokens included
    c.rl.learning_rate = 5e-5               # AdamW learning rate (constant after warm-up)
    c.rl.train_length_bucket = 16           # training pads completions to a multiple of this
    c.rewards.weights = ml_collections.ConfigDict({
        "exact_match": 1.0,                 # the answer equals the corpus fact
        "format_strict": 0.0,               # logged as format_rate only
        "tool_use": 0.0,                    # logged as the tool-call rate only
    })

    c.eval.num_problems = 16 if smoke else 100  # held-out questions per evaluation set
    c.eval.max_new_tokens = 32 if smoke else 64  # budget, result tokens included
    return c
