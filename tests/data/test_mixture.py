"""Tests for jaxrl_reason.data.mixture and the mixture task: weighted sampling (frequencies,
determinism, exact resume through the grain iterator), config validation, the union corpus,
per-domain evaluation sets and the per-row `domain_verifier` reward."""
import re
from collections import Counter

import ml_collections
import numpy as np
import pytest

from jaxrl_reason.data import mixture, tasks
from jaxrl_reason.data.pipeline import example_iterator
from jaxrl_reason.rewards import RewardPool
from jaxrl_reason.rewards.domain import domain_verifier

MIX = (("arithmetic", 0.4), ("countdown", 0.3, (1, 2)), ("knights_knaves", 0.2, (2,)),
       ("code", 0.1, (1,)))


def mixed_config(entries=MIX, weights=None) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({
        "task": {"name": "mixture", "mixture": entries, "train_levels": (1, 2, 3),
                 "length_targets": (0, 0)},
        "rewards": {"weights": weights or {"domain_verifier": 1.0, "format_strict": 0.1}}})


# ----------------------------------------------------------------------------- sampling


def test_uniforms_are_uniform_and_counter_based():
    u = mixture.uniforms(0, np.arange(200_000))
    assert u.min() >= 0 and u.max() < 1
    hist = np.histogram(u, bins=10, range=(0, 1))[0] / len(u)
    assert np.all(np.abs(hist - 0.1) < 0.005)
    # A pure function of (seed, index): any subset, in any order, gives the same numbers.
    idx = np.array([199_999, 5, 123_456, 5])
    np.testing.assert_array_equal(mixture.uniforms(0, idx), u[idx])
    assert not np.array_equal(mixture.uniforms(1, np.arange(100)), u[:100])
    with pytest.raises(ValueError, match=">= 0"):
        mixture.uniforms(0, [-1])


@pytest.mark.parametrize("weights", [(0.4, 0.3, 0.2, 0.1), (1.0, 1.0), (5.0, 1.0, 0.25)])
def test_domain_frequencies_match_the_weights(weights):
    n = 100_000
    counts = np.bincount(mixture.domain_indices(weights, 3, np.arange(n)),
                         minlength=len(weights)) / n
    expected = np.asarray(weights) / sum(weights)
    # Binomial standard error is at most 0.0016 at n = 1e5: 4 sigma.
    np.testing.assert_allclose(counts, expected, atol=0.0065)


def test_domain_indices_deterministic_per_seed():
    a = mixture.domain_indices((1, 2, 3), 11, np.arange(1000))
    b = mixture.domain_indices((1, 2, 3), 11, np.arange(1000))
    c = mixture.domain_indices((1, 2, 3), 12, np.arange(1000))
    np.testing.assert_array_equal(a, b)
    assert (a != c).mean() > 0.3
    with pytest.raises(ValueError, match="positive"):
        mixture.domain_indices((1, 0), 0, [0])


def _source(config=None, size=10_000, seed=5):
    return tasks.task_source(config or mixed_config(), "train", (1, 2, 3), size, seed)


def test_mixture_source_items():
    source = _source()
    assert len(source) == 10_000 and "arithmetic: 0.4" in repr(source)
    for i in (0, 1, 77, 9_999):
        example = source[i]
        domain = source.domain_of(i)
        assert example["domain"] == domain.name == example["task"]
        assert example["verifier"] == tasks.get_task(domain.name).verifier
        assert example["level"] in domain.levels
        assert example == source[i]  # random access is deterministic
    with pytest.raises(IndexError):
        source[10_000]


def test_batches_follow_the_weights_and_are_deterministic():
    source = _source()
    it = example_iterator(source, batch_size=16, seed=0)
    domains = [e["domain"] for _ in range(150) for e in next(it)]
    freq = Counter(domains)
    for name, weight, *_ in MIX:
        assert abs(freq[name] / len(domains) - weight) < 0.04, freq
    again = example_iterator(_source(), batch_size=16, seed=0)
    assert [e["id"] for e in next(again)] == [e["id"] for e in next(
        example_iterator(source, batch_size=16, seed=0))]
    other = example_iterator(_source(seed=6), batch_size=16, seed=0)
    assert [e["id"] for e in next(other)] != [e["id"] for e in next(
        example_iterator(source, batch_size=16, seed=0))]


def test_resume_gives_the_same_stream():
    it = example_iterator(_source(), batch_size=8, seed=2)
    for _ in range(5):
        next(it)
    state = it.get_state()
    rest = [[e["id"] for e in next(it)] for _ in range(4)]
    resumed = example_iterator(_source(), batch_size=8, seed=2)  # a fresh process
    resumed.set_state(state)
    assert [[e["id"] for e in next(resumed)] for _ in range(4)] == rest


def test_domains_draw_distinct_problems():
    source = _source(size=2000)
    ids = [source[i]["id"] for i in range(2000)]
    assert len(set(ids)) == len(ids)


# ----------------------------------------------------------------------------- config


def test_parse_mixture_normalizes_and_defaults_levels():
    domains = tasks.mixture_domains(mixed_config())
    assert [d.name for d in domains] == ["arithmetic", "countdown", "knights_knaves", "code"]
    assert sum(d.weight for d in domains) == pytest.approx(1.0)
    assert domains[0].levels == (1, 2, 3) and domains[2].levels == (2,)
    assert [d.verifier for d in domains] == ["correctness", "countdown", "knights_knaves",
                                             "code"]
    # The JSON round trip of a checkpoint's config turns tuples into lists.
    as_lists = mixed_config([["arithmetic", 1], ["code", 3, [1, 2]]])
    domains = tasks.mixture_domains(as_lists)
    assert [d.weight for d in domains] == [0.25, 0.75] and domains[1].levels == (1, 2)


@pytest.mark.parametrize("entries,weights,match", [
    ((), None, "non-empty"),
    ((("arithmetic", 1.0), ("nope", 1.0)), None, r"task.mixture\[1\]: .*nope"),
    ((("arithmetic", -1.0),), None, "positive number"),
    ((("arithmetic", True),), None, "positive number"),
    ((("countdown", 1.0, (0, 9)),), None, "countdown levels in 1..5"),
    ((("arithmetic", 1.0, ()),), None, "non-empty list"),
    ((("file", 1.0),), None, "procedural task"),
    ((("mixture", 1.0),), None, "procedural task"),
    ((("code", 1.0), ("code", 2.0)), None, "once"),
    (("arithmetic",), None, r"\(task, weight\)"),
    ((("arithmetic", 1.0),), {"correctness": 1.0}, "domain_verifier"),
    ((("countdown", 1.0),), {"domain_verifier": 1.0, "countdown": 0.5}, "every row"),
])
def test_mixture_problems(entries, weights, match):
    config = mixed_config(entries, weights)
    problems = mixture.mixture_problems(config.task, config.rewards.weights, tasks.get_task)
    assert any(re.search(match, p) for p in problems), problems


def test_validate_config_reports_mixture_problems():
    from configs import arith_grpo

    from jaxrl_reason.config.validation import validate_config
    config = arith_grpo.get_config("smoke")
    with config.unlocked():
        config.task.name = "mixture"
        config.task.mixture = (("arithmetic", 1.0), ("countdown", 0.0))
    problems = validate_config(config, 8)
    assert any(p.startswith("task.mixture[1]") for p in problems), problems
    assert any("domain_verifier" in p for p in problems), problems
    with config.unlocked():
        config.task.name = "arithmetic"
    problems = validate_config(config, 8)
    assert any("task.name='mixture'" in p for p in problems), problems


# ----------------------------------------------------------------------------- corpus, eval


def test_mixture_corpus_is_the_union():
    config = mixed_config((("arithmetic", 0.9), ("code", 0.1)))
    corpus = tasks.get_task("mixture").corpus(config, 20)
    assert corpus == (tasks.get_task("arithmetic").corpus(config, 20)
                      + tasks.get_task("code").corpus(config, 20))


def test_eval_sources_per_domain():
    from jaxrl_reason.evaluation.runner import level_set_name
    config = mixed_config()
    sets = tasks.eval_sources(config, 8, 1234, level_set_name)
    assert list(sets) == ["arithmetic: levels 1-3 (held-out)",
                          "countdown: levels 1-2 (held-out)",
                          "knights_knaves: level 2 (held-out)", "code: level 1 (held-out)"]
    for name, examples in sets.items():
        assert len(examples) == 8
        domain = name.split(":")[0]
        assert all(e["domain"] == domain and "-eval-" in e["id"] for e in examples)
    assert tasks.task_verifier(config) == "domain_verifier"


# ----------------------------------------------------------------------------- rewards


def test_domain_verifier_scores_each_row_with_its_domain():
    source = _source(mixed_config(), size=400)
    rows = []
    for name in ("arithmetic", "countdown", "knights_knaves", "code"):
        rows.append(next(source[i] for i in range(400) if source[i]["domain"] == name))
    gold = [r["completion"] for r in rows]
    wrong = ["<think>x</think><answer>12345</answer>"] * len(rows)
    with RewardPool({"domain_verifier": 1.0}, num_workers=2, timeout_s=30.0,
                    verifier="domain_verifier") as pool:
        out = pool.score(gold + wrong, rows + rows)
    np.testing.assert_array_equal(out.components["domain_verifier"], [1, 1, 1, 1, 0, 0, 0, 0])
    assert domain_verifier("<answer>1</answer>", {"prompt": "p", "answer": "1"}).reason \
        == "no_verifier"
    with pytest.raises(ValueError, match="own verifier"):
        domain_verifier("x", {"verifier": "domain_verifier"})
    # Options reach the domain's verifier.
    code_row = rows[3]
    result = domain_verifier(code_row["completion"], code_row,
                             verifier_options={"code": {"limits": {"wall_s": 3.0}}})
    assert result.score == 1.0
