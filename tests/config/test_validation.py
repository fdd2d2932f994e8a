"""Config validation before anything compiles: every problem reported at once, by key."""

from cli_runs import ARITH, load_config
from jaxrl_reason.config.validation import validate_config


def test_validate_config_reports_every_problem_at_once():
    config = load_config(ARITH)
    assert validate_config(config, 8) == []
    config.rl.num_generations = 1
    config.rl.beta = -1.0
    config.sft.learning_rate = 0.0
    config.eval.num_samples = 0
    config.rl.kl_estimator = "k9"
    config.task.prompt_buckets = ()
    problems = validate_config(config, 8)
    for key in ("rl.num_generations", "rl.beta", "sft.learning_rate", "eval.num_samples",
                "rl.kl_estimator", "task.prompt_buckets"):
        assert any(p.startswith(key + ":") for p in problems), (key, problems)


def test_validate_config_mesh_that_does_not_fit():
    config = load_config(ARITH)
    config.mesh.data = 3
    problems = validate_config(config, 8)
    assert problems and all(p.startswith("mesh:") for p in problems), problems


def test_verdict_limits_are_checked_and_optional():
    """The reward pool's backstop and evaluation's retry and unscored share: a bad value is
    named by its key; a config without them (older ones) is valid."""
    config = load_config(ARITH)
    config.rewards.backstop_factor = 0.5
    config.eval.retry_limit_factor = float("nan")
    config.eval.max_unscored_share = 1.5
    problems = validate_config(config, 8)
    for key in ("rewards.backstop_factor", "eval.retry_limit_factor",
                "eval.max_unscored_share"):
        assert any(p.startswith(key + ":") for p in problems), (key, problems)
    del config.rewards["backstop_factor"]
    del config.eval["retry_limit_factor"], config.eval["max_unscored_share"]
    assert validate_config(config, 8) == []
