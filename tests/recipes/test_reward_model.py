"""Reward models: Bradley-Terry loss vs numpy, preference files, scoring layout, and a short
training run that learns a held-out preference (long2short pairs) on the "test" preset."""

from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.recipes import reward_model as rm
from jaxrl_reason.data import preferences
from jaxrl_reason.cli import parse
from jaxrl_reason.models.config import get_preset
from jaxrl_reason.models.value_head import ValueModel
from jaxrl_reason.models.scoring import sequence_inputs
from jaxrl_reason.rl.value import init_value_params
from jaxrl_reason.runtime.build import build_runtime
from jaxrl_reason.runtime import sharding as shd
from numerics import value_head_tolerance

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMOKE = os.path.join(REPO, "configs", "arith_grpo.py") + ":smoke"
# One response bucket (128 tokens) so that training and scoring compile one program each.
TRAIN_CFG = rm.RewardTrainConfig(steps=30, batch_size=16, learning_rate=3e-3, warmup_steps=3,
                                 prompt_buckets=(16,), max_response_length=128,
                                 length_bucket=128, seed=0)


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    _, fv = parse(["jaxrl-reason", "sft", "--config", SMOKE])
    return build_runtime(fv.config, str(tmp_path_factory.mktemp("rm")))


@pytest.fixture(scope="module")
def model_cfg(rt):
    return get_preset("test", vocab_size=rt.tokenizer.vocab_size)


# ----------------------------------------------------------------------------- loss


def _np_bt(rc, rr, margin, center):
    x = rc - rr - margin
    return np.mean(np.logaddexp(0.0, -x)) + center * np.mean((rc + rr) ** 2)


@pytest.mark.parametrize("margin,center", [(None, 0.0), (0.5, 0.0), ("rows", 0.01)])
def test_bradley_terry_loss_matches_numpy(margin, center):
    rng = np.random.default_rng(0)
    rc, rr = rng.normal(size=16).astype(np.float32) * 3, rng.normal(size=16).astype(np.float32)
    m = rng.uniform(0, 1, size=16).astype(np.float32) if margin == "rows" else margin
    loss, metrics = rm.bradley_terry_loss(rc, rr, margin=m, center_coef=center)
    np_m = 0.0 if m is None else m
    np.testing.assert_allclose(float(loss), _np_bt(rc, rr, np_m, center), rtol=1e-5)
    assert float(metrics["accuracy"]) == pytest.approx(np.mean(rc > rr))
    assert float(metrics["margin"]) == pytest.approx(np.mean(rc - rr), rel=1e-5)
    # Gradient w.r.t. r_chosen: -sigmoid(-(rc - rr - m)) / B + 2 c (rc + rr) / B.
    grad = jax.grad(lambda a: rm.bradley_terry_loss(a, rr, margin=m, center_coef=center)[0])(
        jnp.asarray(rc))
    x = rc - rr - np_m
    want = -1.0 / (1.0 + np.exp(x)) / 16 + 2 * center * (rc + rr) / 16
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-4, atol=1e-7)


def test_bradley_terry_loss_is_stable_for_large_gaps():
    loss, _ = rm.bradley_terry_loss(jnp.array([-200.0, 200.0]), jnp.array([200.0, -200.0]))
    assert np.isfinite(float(loss)) and float(loss) == pytest.approx(200.0, rel=1e-5)


# ----------------------------------------------------------------------------- files


def test_pair_file_round_trip(tmp_path):
    pairs = preferences.arithmetic_preference_pairs(6, corruption=preferences.CORRUPTIONS)
    path = tmp_path / "prefs.jsonl"
    assert preferences.write_preference_pairs(path, pairs) == 6
    back = preferences.read_preference_pairs(path)
    for a, b in zip(pairs, back):
        assert {k: a[k] for k in ("id", "prompt", "chosen", "rejected", "margin", "kind")} \
            == {k: b[k] for k in ("id", "prompt", "chosen", "rejected", "margin", "kind")}
    # Without an id, the pair is named after the file and line.
    (tmp_path / "x.jsonl").write_text('\n{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    assert preferences.read_preference_pairs(tmp_path / "x.jsonl")[0]["id"] == "x-2"


@pytest.mark.parametrize("line,reason", [
    ('{"prompt": "p", "chosen": "a"', "malformed JSON"),
    ('["p", "a", "b"]', "expected a JSON object"),
    ('{"prompt": "p", "chosen": "a"}', "missing field 'rejected'"),
    ('{"prompt": "p", "chosen": 3, "rejected": "b"}', "'chosen' must be a non-empty string"),
    ('{"prompt": "p", "chosen": "a", "rejected": "a"}', "same text"),
    ('{"prompt": "p", "chosen": "a", "rejected": "b", "margin": "x"}', "'margin'"),
])
def test_bad_pair_lines_are_named_by_file_and_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"})
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(ValueError, match=rf"bad\.jsonl:3: .*{reason}"):
        preferences.read_preference_pairs(path)


def test_empty_or_missing_pair_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(ValueError, match="no preference pairs"):
        preferences.read_preference_pairs(tmp_path / "empty.jsonl")
    with pytest.raises(FileNotFoundError):
        preferences.read_preference_pairs(tmp_path / "nope.jsonl")


def test_generated_pairs_differ_and_splits_are_disjoint():
    train = preferences.arithmetic_preference_pairs(200, corruption=preferences.CORRUPTIONS)
    held = preferences.arithmetic_preference_pairs(200, split="eval", seed=1)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}
    for p in train:
        assert p["rejected"] != p["chosen"]
        if p["kind"] == "answer":  # same length, only the answer differs
            assert len(p["rejected"]) == len(p["chosen"])
            assert p["rejected"].split("<answer>")[0] == p["chosen"].split("<answer>")[0]
    make = preferences.arithmetic_preference_pairs
    assert make(5, seed=3) == make(5, seed=3)


# ----------------------------------------------------------------------------- layout


def test_encode_pairs_layout_and_errors(rt):
    pairs = preferences.arithmetic_preference_pairs(4, levels=(1,), corruption="verbose")
    batch = rm.encode_pairs(rt.tokenizer, pairs, TRAIN_CFG)
    tok = rt.tokenizer
    assert batch["chosen_tokens"].shape == batch["rejected_tokens"].shape == (4, 128)
    assert batch["prompt_tokens"].shape == (4, 16) and batch["margin"].shape == (4,)
    for i, p in enumerate(pairs):
        for side in ("chosen", "rejected"):
            n = int(batch[f"{side}_mask"][i].sum())
            row = batch[f"{side}_tokens"][i]
            assert row[n - 1] == tok.eos_id and tok.decode(row[:n]) == p[side]
        assert batch["prompt_valid"][i, -1] and tok.decode(batch["prompt_tokens"][i]) == p["prompt"]
    small = rm.RewardTrainConfig(max_response_length=20, length_bucket=8, prompt_buckets=(16,))
    with pytest.raises(ValueError, match=f"{pairs[0]['id']}.*max_response_length=20"):
        rm.encode_pairs(tok, pairs, small)


def test_score_is_read_at_the_last_real_token(rt, model_cfg):
    params = init_value_params(model_cfg, jax.random.key(1), rt.mesh, rt.rules,
                               head_init_std=0.5)
    prompts, responses = ["What is 3+4?", "What is 12+9?"], ["<answer>7</answer>", "21"]

    def encoded(bucket, length):
        return rm.encode_responses(rt.tokenizer, prompts, responses, prompt_buckets=(bucket,),
                                   max_response_length=64, length_bucket=8,
                                   response_length=length)

    a, b = encoded(16, 8), encoded(32, 24)  # other paddings, same rows
    def args(e):
        return [e[k] for k in ("prompt_tokens", "prompt_valid", "completion_tokens",
                               "completion_mask")]

    score = rm.make_score_fn(model_cfg)
    sa, sb = score(params, *args(a)), score(params, *args(b))
    assert sa.dtype == jnp.float32 and sa.shape == (2,)
    # Other paddings, other attention lengths and summation orders (tests/numerics.py).
    atol = value_head_tolerance(model_cfg, params, tokens=32 + 24)
    np.testing.assert_allclose(np.asarray(sa), np.asarray(sb), rtol=0, atol=atol)
    # Same as the value model's output at the last completion token.
    values = jax.jit(lambda p, *x: ValueModel(model_cfg).apply({"params": p}, *x))(
        params, *sequence_inputs(*args(a)))
    last = 16 + a["completion_mask"].sum(1).astype(int) - 1
    np.testing.assert_allclose(np.asarray(sa), np.asarray(values)[np.arange(2), last],
                               rtol=0, atol=atol)


# ----------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def trained(rt, model_cfg):
    train = preferences.arithmetic_preference_pairs(512, levels=(1,), corruption="verbose")
    held = preferences.arithmetic_preference_pairs(64, split="eval", levels=(1,),
                                                   corruption="verbose", seed=1)
    params, history = rm.train_reward_model(model_cfg, rt.tokenizer, train, mesh=rt.mesh,
                                            rules=rt.rules, train_cfg=TRAIN_CFG,
                                            eval_pairs=held)
    return params, history, held


def test_training_learns_held_out_preferences(rt, model_cfg, trained):
    params, history, held = trained
    assert len(history) == TRAIN_CFG.steps
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    assert history[-1]["eval/accuracy"] > 0.9  # chance is 0.5
    # Every held-out pair is of kind "verbose": its breakdown is the whole accuracy.
    assert history[-1]["eval/accuracy/verbose"] == history[-1]["eval/accuracy"]
    # score_texts: float32 [N], chosen above rejected on held-out pairs.
    rc = rm.score_texts(model_cfg, params, rt.tokenizer, [p["prompt"] for p in held],
                        [p["chosen"] for p in held], mesh=rt.mesh, rules=rt.rules,
                        train_cfg=TRAIN_CFG)
    rr = rm.score_texts(model_cfg, params, rt.tokenizer, [p["prompt"] for p in held],
                        [p["rejected"] for p in held], mesh=rt.mesh, rules=rt.rules,
                        train_cfg=TRAIN_CFG)
    assert rc.dtype == np.float32 and rc.shape == (len(held),)
    assert np.mean(rc > rr) > 0.9


def test_pairwise_accuracy_breaks_down_by_kind(rt, model_cfg, trained):
    """Per-kind accuracy = the win rate (ties 1/2) of that kind's pairs, from the scores."""
    params, _, held = trained
    mixed = held[:8] + preferences.arithmetic_preference_pairs(8, split="eval", levels=(1,),
                                                      corruption="truncated", seed=2)
    result = rm.pairwise_accuracy(model_cfg, params, rt.tokenizer, mixed, mesh=rt.mesh,
                                  rules=rt.rules, train_cfg=TRAIN_CFG)
    score = functools.partial(rm.score_texts, model_cfg, params, rt.tokenizer, mesh=rt.mesh,
                              rules=rt.rules, train_cfg=TRAIN_CFG)
    prompts = [p["prompt"] for p in mixed]
    rc = score(prompts, [p["chosen"] for p in mixed])
    rr = score(prompts, [p["rejected"] for p in mixed])
    wins = np.where(rc > rr, 1.0, np.where(rc == rr, 0.5, 0.0))
    assert sorted(k for k in result if k.startswith("accuracy/")) == [
        "accuracy/truncated", "accuracy/verbose"]
    assert result["accuracy/verbose"] == pytest.approx(wins[:8].mean())
    assert result["accuracy/truncated"] == pytest.approx(wins[8:].mean())
    assert result["accuracy"] == pytest.approx(wins.mean())


def test_score_fn_on_the_mesh(rt, model_cfg, trained):
    """The RL trainer's call: rollout-shaped arrays on the mesh -> f32 [N] on the mesh."""
    params, _, held = trained
    rows = held[:16]
    batch = rm.encode_responses(rt.tokenizer, [p["prompt"] for p in rows],
                                [p["chosen"] for p in rows], prompt_buckets=(16,),
                                max_response_length=128, length_bucket=128)
    on_mesh = [rt.put(batch[k]) for k in ("prompt_tokens", "prompt_valid",
                                          "completion_tokens", "completion_mask")]
    scores = rm.make_score_fn(model_cfg)(params, *on_mesh)
    assert scores.shape == (16,) and scores.dtype == jnp.float32
    assert isinstance(scores.sharding, jax.sharding.NamedSharding)
    assert rm.make_score_fn(model_cfg) is rm.make_score_fn(model_cfg)  # compiled once


def test_save_and_load(rt, model_cfg, trained, tmp_path):
    params, history, held = trained
    rm.save_reward_model(str(tmp_path / "rm"), params, model_cfg, rt.tokenizer, step=30,
                         metadata={"eval": {"accuracy": history[-1]["eval/accuracy"]}})
    loaded, cfg, tok, meta = rm.load_reward_model(str(tmp_path / "rm"), rt.mesh, rt.rules)
    assert cfg == model_cfg and tok.serialized == rt.tokenizer.serialized
    assert meta["eval"]["accuracy"] == history[-1]["eval/accuracy"]
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    head = loaded["head"]["kernel"]
    assert head.sharding.spec == shd.logical_to_spec(("embed", None), rt.rules, head.shape,
                                                     rt.mesh)
    # A policy checkpoint is not mistaken for a reward model.
    from jaxrl_reason.checkpoints.checkpointer import Checkpointer
    with Checkpointer(str(tmp_path / "policy")) as ckpt:
        ckpt.save(1, {"params": {"w": np.zeros(2, np.float32)}}, {"phase": "sft"})
    with pytest.raises(ValueError, match="not a reward model"):
        rm.load_reward_model(str(tmp_path / "policy"), rt.mesh, rt.rules)


# ----------------------------------------------------------------------------- command helpers


def test_split_pairs_holds_out_whole_prompts():
    pairs = preferences.arithmetic_preference_pairs(40, corruption=preferences.CORRUPTIONS)
    pairs += [dict(pairs[0], id="dup", rejected=pairs[0]["rejected"] + " x")]  # same prompt
    train, held = preferences.split_pairs(pairs, 0.25, seed=3)
    assert len(train) + len(held) == len(pairs) and len(held) >= 10
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in held}
    assert preferences.split_pairs(pairs, 0.25, seed=3) == (train, held)  # deterministic
    with pytest.raises(ValueError, match=r"eval_fraction must be in \(0, 1\)"):
        preferences.split_pairs(pairs, 1.0)
    with pytest.raises(ValueError, match="1 distinct prompt"):
        preferences.split_pairs(pairs[:1], 0.5)


def test_train_config_from_a_run_config():
    _, fv = parse(["jaxrl-reason", "sft", "--config", SMOKE])
    cfg = rm.train_config_from(fv.config, steps=7, learning_rate=None)
    assert cfg.steps == 7 and cfg.learning_rate == rm.RewardTrainConfig().learning_rate
    assert cfg.prompt_buckets == tuple(fv.config.task.prompt_buckets)
    with pytest.raises(ValueError, match="unknown training field"):
        rm.train_config_from(fv.config, stepz=3)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        rm.train_config_from(fv.config, batch_size=0)
