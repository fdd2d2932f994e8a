"""The sampler tests' toy setup: a random `test`-preset model with large weights (diverse,
non-repeating outputs) and four left-padded prompts of uneven lengths."""
from jaxrl_reason import models

PAD = 0
PROMPT_LENGTHS = (6, 3, 1, 4)
BUCKET = 6  # the prompts' padded length
CFG = models.get_preset("test", init_std=0.5)
