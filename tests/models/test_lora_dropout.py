"""LoRA dropout (`model.lora.dropout`): it acts on the adapter's input in the training updates
only (policy update, micro-batched too), with masks folded from the seed and the optimizer
step; the sampler, the old-policy / reference scoring and evaluation run without it; and the
bad `model.lora` values each get a clear error."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxrl_reason import models
from jaxrl_reason.runtime import sharding as shd
from jaxrl_reason.models import lora as lora_lib, scoring
from jaxrl_reason.models.transformer import Transformer
from jaxrl_reason.rl.update import make_logprob_fn, make_update_fn
from jaxrl_reason.runtime.train_state import create_train_state, make_optimizer
from jaxrl_reason.sampling.sampler import Sampler, left_pad
from numerics import decoder_tolerance

BASE = models.get_preset("test", init_std=0.2)
LORA = {"r": 4, "lora_alpha": 8.0, "target_modules": "all-linear"}
RULES = shd.DEFAULT_RULES
L = 6


@pytest.fixture(scope="module")
def mesh1():
    return shd.make_mesh({"data": 1}, devices=jax.devices()[:1])


def _params(cfg, mesh):
    """LoRA params of `cfg` with nonzero B (fresh ones have B = 0: the adapter adds 0)."""
    params = models.init_params(cfg, jax.random.key(0), mesh, RULES)
    adapters, base = lora_lib.split_adapters(params)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.2 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return lora_lib.merge_trees(jax.tree.unflatten(treedef, leaves), base)


# ----------------------------------------------------------------------------- the layer


def test_dropout_zeroes_and_rescales_the_adapter_input_only():
    """A = B = I (rank = width): the adapter adds scaling * dropout(x), so each entry of the
    difference to the base is 0 or scaling * x / (1 - p); without a key it is scaling * x."""
    p, width = 0.25, 64
    lora = lora_lib.LoraConfig(rank=width, alpha=float(width), dropout=p, targets="q_proj")
    proj = lora_lib.Projection(features=(width,), contract=1, use_bias=False,
                               dtype=jnp.float32, param_dtype=jnp.float32,
                               kernel_init=jax.nn.initializers.normal(1.0),
                               kernel_logical=("embed", "mlp"), lora=lora, adapted=True)
    x = jax.random.normal(jax.random.key(0), (8, width))
    params = proj.init(jax.random.key(1), x)["params"]
    params = jax.tree.map(lambda v: getattr(v, "value", v), params,
                          is_leaf=lambda v: hasattr(v, "value"))
    eye = jnp.eye(width)
    params = {**params, "lora_a": eye, "lora_b": eye}
    base = x @ params["kernel"]
    plain = proj.apply({"params": params}, x)  # no key: no dropout (scaling = 1)
    np.testing.assert_allclose(np.asarray(plain - base), np.asarray(x), rtol=1e-5, atol=1e-5)
    rngs = {lora_lib.DROPOUT_RNG: jax.random.key(7)}
    delta = np.asarray(proj.apply({"params": params}, x, rngs=rngs) - base)
    kept = np.abs(delta) > 1e-6 * np.abs(np.asarray(x)).max()
    np.testing.assert_allclose(delta[kept], np.asarray(x)[kept] / (1 - p), rtol=1e-4)
    np.testing.assert_allclose(delta[~kept], 0.0, atol=1e-5)
    assert abs(1 - kept.mean() - p) < 0.06  # 512 draws: the dropped fraction is about p
    again = np.asarray(proj.apply({"params": params}, x, rngs=rngs) - base)
    np.testing.assert_array_equal(again, delta)  # the same key draws the same mask


def test_dropout_key_is_none_without_dropout():
    assert lora_lib.dropout_key(None, 0, jnp.int32(3)) is None
    assert lora_lib.dropout_key(lora_lib.LoraConfig(), 0, jnp.int32(3)) is None
    cfg = lora_lib.LoraConfig(dropout=0.1)
    a, b = (lora_lib.dropout_key(cfg, 0, jnp.int32(s)) for s in (3, 4))
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    same = lora_lib.dropout_key(cfg, 0, jnp.int32(3))
    np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(same))


# ----------------------------------------------------------------------------- the update


def _rl(micro_batches=1):
    return ml_collections.ConfigDict({
        "temperature": 1.0, "num_iterations": 2, "beta": 0.0, "kl_in_reward": False,
        "loss_type": "grpo", "epsilon_low": 0.2, "epsilon_high": 0.2, "max_new_tokens": L,
        "kl_estimator": "k3", "entropy_coef": 0.0, "policy_loss_mode": "ppo",
        "clip_ratio_c": 0.0, "tis_cap": 0.0, "micro_batches": micro_batches})


def _batch(cfg, rows=4):
    rng = np.random.default_rng(0)
    prompt_tokens, prompt_valid = left_pad(
        [list(rng.integers(2, cfg.vocab_size, n)) for n in (4, 3, 5, 2)[:rows]], 5, 0)
    lengths = np.array([6, 4, 5, 3][:rows])
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.float32)
    return {"prompt_tokens": jnp.asarray(prompt_tokens), "prompt_valid": jnp.asarray(prompt_valid),
            "completion_tokens": jnp.asarray(rng.integers(2, cfg.vocab_size, (rows, L))),
            "mask": jnp.asarray(mask), "advantages": jnp.asarray([1.0, -0.5, 0.5, -1.0][:rows]),
            "num_sequences": np.float32(rows), "num_tokens": np.float32(mask.sum()),
            "beta": np.float32(0.0)}


def _losses(cfg, params, mesh, steps=(0, 0, 1), seed=0, micro_batches=1):
    """The update's (loss, grad_norm) from the same params and batch at optimizer steps
    `steps` (a second PPO epoch: the old log-probs are the eval-mode pass's, so the ratio,
    hence the loss, sees the update pass's dropout)."""
    optimizer = make_optimizer(1e-3, weight_decay=0.0, max_grad_norm=1e9)
    model = Transformer(cfg)
    update = make_update_fn(model, optimizer, _rl(micro_batches), mesh, RULES,
                            kernel_backend="reference", dropout_seed=seed)
    batch = _batch(cfg)
    batch["old_logp"] = make_logprob_fn(model, 1.0, 1, mesh, RULES)(
        params, batch["prompt_tokens"], batch["prompt_valid"], batch["completion_tokens"],
        batch["mask"])
    out = []
    for step in steps:
        state = create_train_state(jax.tree.map(jnp.copy, params), optimizer)
        state = state.replace(step=jnp.asarray(step, jnp.int32))
        _, metrics = update(state, batch)
        out.append((float(metrics["loss"]), float(metrics["grad_norm"])))
    return out


@pytest.mark.parametrize("scan", [False, True])
def test_update_applies_dropout_reproducibly(scan, mesh1):
    cfg = BASE.replace(lora={**LORA, "lora_dropout": 0.3}, scan_layers=scan)
    params = _params(cfg, mesh1)
    no_dropout = cfg.replace(lora={**LORA, "lora_dropout": 0.0})
    plain, = _losses(no_dropout, params, mesh1, steps=(0,))
    first, again, next_step = _losses(cfg, params, mesh1)
    assert abs(first[0] - plain[0]) > 1e-4 * abs(plain[0])  # dropout acts in the update
    assert abs(first[1] - plain[1]) > 1e-4 * plain[1]
    assert first == again  # same params, batch, seed and step: the same masks
    assert next_step != first  # another step draws other masks
    other_seed, = _losses(cfg, params, mesh1, steps=(0,), seed=1)
    assert other_seed != first


def test_micro_batched_update_applies_dropout_reproducibly(mesh1):
    cfg = BASE.replace(lora={**LORA, "lora_dropout": 0.3})
    params = _params(cfg, mesh1)
    plain, = _losses(cfg.replace(lora={**LORA}), params, mesh1, steps=(0,), micro_batches=2)
    first, again, _ = _losses(cfg, params, mesh1, micro_batches=2)
    assert first == again and abs(first[0] - plain[0]) > 1e-4 * abs(plain[0])


def test_scoring_passes_run_without_dropout(mesh1):
    """The old-policy / reference pass (`make_logprob_fn`) and evaluation's scoring are the
    same with dropout 0.3 as with 0: no key reaches them."""
    cfg = BASE.replace(lora={**LORA, "lora_dropout": 0.3})
    params = _params(cfg, mesh1)
    batch = _batch(cfg)
    args = (batch["prompt_tokens"], batch["prompt_valid"], batch["completion_tokens"],
            batch["mask"])
    with_dropout = make_logprob_fn(Transformer(cfg), 1.0, 1, mesh1, RULES)(params, *args)
    without = make_logprob_fn(Transformer(cfg.replace(lora=LORA)), 1.0, 1, mesh1,
                              RULES)(params, *args)
    np.testing.assert_array_equal(np.asarray(with_dropout), np.asarray(without))


def test_sampler_logprobs_equal_eval_mode_scoring(mesh1):
    """float32, dropout 0.3: the sampler's log-probs are the trainer's eval-mode (no key)
    log-probs to 1e-5 (relative: log-probs reach -7 here, and the two programs sum in
    different orders: decode attends over a KV cache one token at a time, scoring runs the
    whole sequence; 6e-6 was seen), inside the float32 bound of
    `numerics.decoder_tolerance`."""
    cfg = BASE.replace(lora={**LORA, "lora_dropout": 0.3}, dtype="float32",
                       param_dtype="float32")
    params = _params(cfg, mesh1)
    rng = np.random.default_rng(0)
    prompts = left_pad([list(rng.integers(1, cfg.vocab_size, n)) for n in (5, 3)], 5, 0)
    sampler = Sampler(Transformer(cfg), eos_id=1, pad_id=0, mesh=mesh1)
    out = jax.tree.map(np.asarray, sampler(params, *prompts, jax.random.key(3), num_samples=2,
                                           max_new_tokens=L, temperature=1.0))
    prompt_tokens, prompt_valid = (np.repeat(x, 2, axis=0) for x in prompts)
    mask = scoring.completion_mask_from_lengths(jnp.asarray(out.lengths), L)
    logp, _ = scoring.completion_logprobs(Transformer(cfg), params, prompt_tokens, prompt_valid,
                                          jnp.asarray(out.tokens), mask, with_entropy=False)
    np.testing.assert_allclose(out.logprobs, np.asarray(logp), rtol=1e-5, atol=1e-5)
    bound = decoder_tolerance(cfg, params, tokens=5 + L)
    assert float(np.abs(out.logprobs - np.asarray(logp)).max()) <= bound
    # the training pass (a key) scores the same tokens differently
    trained, _ = scoring.completion_logprobs(
        Transformer(cfg), params, prompt_tokens, prompt_valid, jnp.asarray(out.tokens), mask,
        with_entropy=False, dropout_rng=jax.random.key(0))
    assert float(jnp.abs(trained - logp).max()) > 1e-4


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("lora,message", [
    ({"dropout": -0.1}, "dropout must be a float in [0, 1), got -0.1"),
    ({"lora_dropout": 1.0}, "dropout must be a float in [0, 1), got 1.0"),
    ({"dropout": "0.1"}, "dropout must be a float in [0, 1), got '0.1'"),
    ({"alpha": 0}, "alpha must be positive, got 0"),
    ({"lora_alpha": -8.0}, "alpha must be positive, got -8.0"),
    ({"r": 0}, "rank must be a positive int, got 0"),
    ({"rank": 2.5}, "rank must be a positive int, got 2.5"),
    ({"base_quant": "fp8"}, "base_quant must be one of ('none', 'int8', 'nf4'), got 'fp8'"),
    ({"targets": ("attn.qq_proj",)},
     "target 'attn.qq_proj' matches no projection; the projections are ['attn.q_proj'"),
])
def test_bad_values_name_the_problem(lora, message):
    with pytest.raises(ValueError, match=r"invalid model\.lora: .*" + __import__("re").escape(
            message)):
        BASE.replace(lora=lora)


def test_dropout_in_range_is_accepted():
    assert BASE.replace(lora={"lora_dropout": 0.05}).lora.dropout == 0.05
