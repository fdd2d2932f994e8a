"""Fixtures of the sampler tests: the toy prompts, a 1-device and an 8-device mesh, and the toy
model's params on each (the same values: one seed)."""
import jax
import numpy as np
import pytest

from toy_model import BUCKET, CFG, PAD, PROMPT_LENGTHS
from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.sampling.sampler import left_pad


@pytest.fixture(scope="module")
def prompts():
    """int32 [4, BUCKET] left-padded prompts of PROMPT_LENGTHS random tokens (seed 0)."""
    rng = np.random.default_rng(0)
    return left_pad([list(rng.integers(1, CFG.vocab_size, n)) for n in PROMPT_LENGTHS],
                    BUCKET, PAD)


@pytest.fixture(scope="module")
def meshes():
    return {"1dev": shd.make_mesh({"data": 1}, devices=jax.devices()[:1]),
            "8dev": shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})}


@pytest.fixture(scope="module")
def params(meshes):
    return {name: models.init_params(CFG, jax.random.key(0), mesh, shd.DEFAULT_RULES)
            for name, mesh in meshes.items()}
