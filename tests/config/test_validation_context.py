"""Config validation under context parallelism and micro-batches of packs: mesh.context=-1
is checked at its resolved size, each phase that runs must pack, the sampler's rows must
split over data x context, rows need not split into rl.micro_batches when packs do; and
`plan`'s advice names every override of the configuration it measured."""
import os

import ml_collections
import pytest

from jaxrl_reason.cli import parse
from jaxrl_reason.config.validation import validate_config
from jaxrl_reason.runtime import plan as planner

SMOKE = os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                     "arith_grpo.py") + ":smoke"


def _config(**changes):
    _, fv = parse(["jaxrl-reason", "train", "--config", SMOKE])
    config = fv.config
    config.rl.packing, config.rl.pack_tokens = True, 256
    config.sft.packing, config.sft.pack_tokens = True, 256
    with config.unlocked():
        for key, value in changes.items():
            node, _, leaf = key.rpartition(".")
            setattr(config[node] if node else config, leaf, value)
    return config


def _problems(config, devices=8):
    return "\n".join(validate_config(config, devices))


def test_context_minus_one_is_checked_at_its_resolved_size():
    config = _config(**{"mesh.data": 2, "mesh.context": -1, "rl.pack_tokens": 250})
    assert "rl.pack_tokens: 250 does not divide by mesh.context=4" in _problems(config)
    config.rl.packing = False
    assert "context parallelism (4) splits the packed training passes" in _problems(config)


@pytest.mark.parametrize("change, match", [
    ({"sft.packing": False}, "context parallelism (4) splits packed SFT steps too; set "
                             "sft.packing=True"),
    ({"rl.batch_prompts": 3, "rl.num_generations": 4},
     "3 x 4 = 12 rows do not split over 2 data-parallel x 4 context shards"),
])
def test_each_phase_packs_and_rows_split_over_data_and_context(change, match):
    assert _problems(_config(**{"mesh.data": 2, "mesh.context": 4})) == ""
    assert match in _problems(_config(**{"mesh.data": 2, "mesh.context": 4, **change}))


def test_packed_rows_need_not_split_into_micro_batches():
    config = _config(**{"rl.micro_batches": 3})  # 32 rows: packs split, rows need not
    assert "rl.micro_batches" not in _problems(config, 1)
    config.rl.packing = False
    assert "rows do not split into 3 micro-batches" in _problems(config, 1)


def test_plan_advice_names_every_override_of_the_measured_config():
    """`with_context` grows rl.micro_batches and may rewrite the rules: the advice says so,
    not just the mesh."""
    _, fv = parse(["jaxrl-reason", "plan", "--config", SMOKE, "--topology", "v5e:2x4",
                   "--config.mesh.data=1", "--config.mesh.fsdp=8", "--config.rl.packing=True",
                   "--config.rl.micro_batches=2"])
    config = fv.config
    config.sharding_rules = tuple((n, "fsdp" if n == "embed" else a)
                                  for n, a in config.sharding_rules)
    chosen = planner.with_context(config, 4, 8)
    overrides = planner.context_overrides(config, chosen)
    assert "mesh.context=4" in overrides and "mesh.fsdp=2" in overrides
    assert "rl.micro_batches=8" in overrides
    assert any(o.startswith("sharding_rules=") and "('fsdp', 'context')" in o
               for o in overrides), overrides
    report = {"chip": planner.CHIPS["v5e"], "programs": [], "mesh": {},
              "context": {"chosen": 4, "reason": "r", "overrides": overrides}}
    text = "\n".join(planner.advice(report))
    assert "--config.rl.micro_batches=8" in text and "--config.mesh.context=4" in text
    # the default rules already shard the weights over fsdp x context: nothing to rewrite
    _, fv = parse(["jaxrl-reason", "plan", "--config", SMOKE, "--topology", "v5e:2x4",
                   "--config.mesh.data=1", "--config.mesh.fsdp=8", "--config.rl.packing=True"])
    default = planner.context_overrides(fv.config, planner.with_context(fv.config, 2, 8))
    assert not any(o.startswith("sharding_rules") for o in default), default
    assert isinstance(fv.config, ml_collections.ConfigDict)
