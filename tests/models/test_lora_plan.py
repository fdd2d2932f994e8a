"""`plan` with LoRA: the update's arguments hold Adam state for the adapters only, the
frozen base shrinks with int8/nf4, and beta > 0 keeps no reference copy resident (needs
libtpu, as tests/runtime/test_plan.py)."""
import importlib.util
import os

import pytest

from jaxrl_reason.cli import parse

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = ("log-prob pass", "update")


def _plan(name, *flags, programs=PROGRAMS):
    from jaxrl_reason.runtime import plan as planner
    _, fv = parse(["jaxrl-reason", "plan", "--config",
                   os.path.join(REPO, "configs", f"{name}.py"), "--topology", "v5e:2x4",
                   "--config.rl.beta=0.04", *flags])
    report = planner.plan(fv.config, "v5e:2x4", programs=programs)
    return {p.name: p for p in report["programs"]}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install 'jaxrl-reason[tpu]')")
def test_lora_plan_has_adapter_optimizer_state_and_no_reference_copy():
    full = _plan("arith_grpo")
    lora = _plan("arith_grpo_lora")
    # the quantized bases are compared on the update alone
    int8 = _plan("arith_grpo_lora", "--config.model.lora.base_quant=int8", programs=("update",))
    nf4 = _plan("arith_grpo_lora", "--config.model.lora.base_quant=nf4", programs=("update",))
    # params + Adam moments of every weight vs params + the adapters' moments
    assert lora["update"].argument_bytes < 0.6 * full["update"].argument_bytes
    assert nf4["update"].argument_bytes < int8["update"].argument_bytes \
        < lora["update"].argument_bytes
    # full fine-tuning keeps a reference copy resident during the log-prob pass; LoRA's
    # reference is its own base (only the adapters' Adam state stays resident)
    assert full["log-prob pass"].resident_bytes > 0.5 * full["log-prob pass"].argument_bytes
    assert lora["log-prob pass"].resident_bytes < 0.2 * lora["log-prob pass"].argument_bytes
    assert lora["update"].resident_bytes == 0


def test_model_params_count_weights_whatever_their_storage():
    """The plan's FLOPs count a quantized base's weights once each (an nf4 byte holds two;
    scales are not weights) and the adapters on top."""
    import math

    import jax

    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.models.lora import lora_config, split_adapters
    from jaxrl_reason.models.params import abstract_params
    from jaxrl_reason.runtime.plan import model_params

    base = get_preset("test", vocab_size=64)
    counts = {}
    for quant in ("none", "int8", "nf4"):
        lora = lora_config({"rank": 4, "targets": "all-linear", "base_quant": quant})
        counts[quant] = model_params(base.replace(lora=lora))
    lora = base.replace(lora=lora_config({"rank": 4, "targets": "all-linear"}))
    adapters, _ = split_adapters(abstract_params(lora))
    n_adapters = sum(math.prod(x.shape) for x in jax.tree.leaves(adapters))
    assert n_adapters > 0
    assert counts == {q: model_params(base) + n_adapters for q in counts}


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install 'jaxrl-reason[tpu]')")
def test_one_chip_topology_is_described():
    """"v5e:1x1" (one chip, a v5litepod-1 host) needs 1-chip host bounds from libtpu."""
    from jaxrl_reason.runtime.plan import GiB, topology_devices
    chip, devices = topology_devices("v5e:1x1")
    assert len(devices) == 1 and chip.hbm_bytes == 16 * GiB
    assert len(topology_devices("v5e:2x2")[1]) == 4
