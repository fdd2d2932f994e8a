"""`jaxrl-reason plan`: ahead-of-time compilation of the RL step for a real TPU slice from
this CPU (needs libtpu: `pip install 'jaxrl-reason[tpu]'`, which CI installs)."""
import dataclasses
import importlib.util
import json
import math
import os

import jax

import pytest

from jaxrl_reason.cli import main, parse

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARITH = os.path.join(REPO, "configs", "arith_grpo.py")
QWEN = os.path.join(REPO, "configs", "qwen2_5_1_5b_gsm8k_grpo.py")
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install "
                                         "'jaxrl-reason[tpu]'); CI installs it")


@needs_libtpu
def test_plan_compiles_every_program_for_v5e_and_reports_memory_and_roofline():
    from jaxrl_reason.runtime import plan as planner

    _, fv = parse(["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology",
                   "v5e:2x4"])
    report = planner.plan(fv.config, "v5e:2x4")
    assert report["devices"] == 8 and report["chip"].name == "TPU v5e"
    names = [p.name for p in report["programs"]]
    assert names == ["sampler", "log-prob pass", "update"]
    for prog in report["programs"]:
        assert 0 < prog.total_bytes < report["chip"].hbm_bytes
        assert prog.flops > 0 and prog.hbm_bytes > 0
        assert 0 < prog.mfu(report["chip"], 8) <= 1
    text = planner.format_report(report)
    assert "fits: yes" in text and "| update |" in text


@needs_libtpu
def test_plan_command_prints_the_table_and_names_a_bad_topology(capsys):
    rc = main(["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology", "v6e:2x4"])
    assert rc == 0
    assert "TPU v6e: 8 chips" in capsys.readouterr().out
    rc = main(["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology", "v9:2x4"])
    assert rc != 0
    assert "unknown TPU generation 'v9'" in capsys.readouterr().err


@needs_libtpu
def test_plan_reports_a_program_that_does_not_fit_and_what_would_help():
    """Two layers with a 64k vocabulary and 64 rows of 2k tokens: with full logits the
    update's [B, L, V] logits and their gradient exceed a v5e chip, XLA refuses it and the
    plan says so; the memory-lean log-probs ("auto" on TPU: chunked) make the same step fit."""
    from jaxrl_reason.runtime import plan as planner

    args = ["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology", "v5e:2x2",
            "--config.model.n_layers=2", "--config.model.vocab_size=65536",
            "--config.rl.batch_prompts=16", "--config.rl.num_generations=4",
            "--config.rl.max_new_tokens=2048", "--config.rl.train_length_bucket=64"]
    _, fv = parse(args + ["--config.model.logprobs_impl=full"])
    report = planner.plan(fv.config, "v5e:2x2", programs=("update",))
    assert [p.name for p in report["programs"]] == ["update"]
    update = report["programs"][-1]
    assert update.total_bytes > report["chip"].hbm_bytes
    text = planner.format_report(report)
    assert "fits: NO" in text and "(does not fit)" in text
    assert "micro-batches" in text or "mesh.fsdp" in text

    _, fv = parse(args)
    lean = planner.plan(fv.config, "v5e:2x2", programs=("update",))["programs"][-1]
    assert lean.total_bytes < report["chip"].hbm_bytes < update.total_bytes


@needs_libtpu
def test_plan_sizes_a_real_model_config_from_its_config_json_with_host_offload(tmp_path):
    """The Qwen2.5-1.5B config's v5e-8 target, sized from a model directory holding only a
    config.json (no weights, no tokenizer): the plan compiles the directory's architecture
    with the config's knobs (scanned layers, bf16, remat, chunked log-probs, Pallas kernels,
    FSDP over 8 chips), and with host offload neither the reference nor the optimizer state
    is resident while the sampler and the update run. The architecture is Qwen2.5's family
    (QKV bias, tied embeddings, grouped KV heads) at a small width and 2 layers, so the test
    compiles in seconds; benchmarks/tpu_plan.py sizes the published shapes."""
    from jaxrl_reason.runtime import plan as planner
    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.models.hf_config import hf_config
    from jaxrl_reason.models.params import abstract_params

    cfg = get_preset("qwen2.5-1.5b", n_layers=2, d_model=256, n_heads=4, n_kv_heads=2,
                     head_dim=64, mlp_hidden=512, vocab_size=8192)
    with open(tmp_path / "config.json", "w") as f:
        json.dump(hf_config(cfg), f)
    num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params(cfg)))
    _, fv = parse(["jaxrl-reason", "plan", "--config", f"{QWEN}:v5e-8", "--topology",
                   "v5e:2x4", f"--config.hf_model={tmp_path}", "--config.rl.max_new_tokens=256",
                   "--config.rl.offload_reference=True", "--config.rl.offload_optimizer=True"])
    report = planner.plan(fv.config, "v5e:2x4")
    assert report["params"] == num_params and report["mesh"]["fsdp"] == 8
    programs = {p.name: p for p in report["programs"]}
    assert list(programs) == ["sampler", "log-prob pass", "update"]
    assert programs["update"].mosaic_calls > 0  # the Pallas loss kernel, compiled by Mosaic
    # Host offload: only the policy stays on the chips beside the reference pass's argument.
    assert programs["sampler"].resident_bytes == 0 and programs["update"].resident_bytes == 0
    policy = programs["log-prob pass"].resident_bytes  # f32 params over 8 chips (a few
    assert policy == pytest.approx(num_params * 4 / 8, rel=0.02)  # small leaves replicated)
    out = planner.format_report(report)
    assert f"{num_params:,} params" in out and "fits: yes" in out


@needs_libtpu
@pytest.mark.parametrize("topology", ["v5e:2x4", "v6e:2x4"])
def test_every_pallas_kernel_compiles_for_tpu_inside_the_real_steps(topology):
    """The update with the fused loss kernel and the Pallas log-prob kernels (forward and
    backward; per device under shard_map on the 8-chip mesh), and the log-prob pass with
    them, compile for v5e and v6e with Mosaic: the HLO holds their tpu_custom_calls."""
    from jaxrl_reason.runtime import plan as planner

    _, fv = parse(["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology",
                   topology, "--config.kernels.backend=pallas",
                   "--config.model.logprobs_impl=pallas", "--config.rl.beta=0.04"])
    report = planner.plan(fv.config, topology)
    progs = {p.name: p for p in report["programs"]}
    # forward (1) + backward (dh, dW) log-prob kernels + loss forward and backward
    assert progs["update"].mosaic_calls >= 5, progs["update"].mosaic_calls
    assert progs["log-prob pass"].mosaic_calls >= 1
    assert all(0 < p.total_bytes < report["chip"].hbm_bytes for p in progs.values())


def test_with_context_takes_chips_from_fsdp_and_keeps_the_weights_sharded():
    """Context size 2 on 8 chips of FSDP: 4 x 2, the weights still sharded over all 8
    (embed over fsdp x context) and the packs' sequence over context; a config that does
    not pack, or a slice without the chips, gets None."""
    from jaxrl_reason.runtime import plan as planner

    _, fv = parse(["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology",
                   "v5e:2x4", "--config.mesh.data=1", "--config.mesh.fsdp=8",
                   "--config.rl.packing=True"])
    c = planner.with_context(fv.config, 2, 8)
    assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor, c.mesh.context) == (1, 4, 1, 2)
    rules = dict(c.sharding_rules)
    assert rules["embed"] == ("fsdp", "context") and rules["length"] == "context"
    assert fv.config.mesh.fsdp == 8  # a copy
    # half the data-parallel shards: twice the micro-batches, the same packs per shard
    assert c.rl.micro_batches == 2 * fv.config.rl.micro_batches
    four = planner.with_context(c, 4, 8)
    assert (four.mesh.fsdp, four.mesh.context) == (2, 4)
    assert four.rl.micro_batches == 4 * fv.config.rl.micro_batches
    assert planner.with_context(fv.config, 16, 8) is None  # no 16 chips to give
    assert planner.with_context(four, 2, 8) is None  # only grows
    fv.config.rl.packing = False
    assert planner.with_context(fv.config, 2, 8) is None  # context parallelism splits packs


def _plan_once(monkeypatch, planner) -> dict:
    """Makes `planner._plan` compile each (config, topology, programs) once per test: a
    second plan of the same config gets the first's report (XLA compiles deterministically;
    a 4k-token update takes tens of seconds to compile). Returns the cache, keyed by
    (config as JSON, topology, mesh.context, programs), in the order compiled."""
    real, compiled = planner._plan, {}

    def plan_once(config, topology, programs=planner.PROGRAMS):
        key = (config.to_json_best_effort(sort_keys=True), topology,
               int(config.mesh.get("context", 1)), tuple(programs))
        if key not in compiled:
            compiled[key] = real(config, topology, programs)
        return compiled[key]

    monkeypatch.setattr(planner, "_plan", plan_once)
    return compiled


@needs_libtpu
def test_plan_chooses_the_smallest_context_size_whose_training_passes_fit(monkeypatch):
    """Packs of 4,096 tokens, one per chip: at context 1 the update needs about 56 MiB per
    chip (XLA's memory analysis on v5e), at context 2 about 15 (each chip holds half a pack:
    the attention scores shrink 4x). On a chip of 32 MiB the plan compiles context 1, finds
    that it does not fit, and chooses 2; the report and the advice say so. Without the
    search the plan compiles context 1 as configured (the same program as the search's
    first: compiled once here, by `_plan_once`)."""
    from jaxrl_reason.runtime import plan as planner

    compiled = _plan_once(monkeypatch, planner)
    small = dataclasses.replace(planner.CHIPS["v5e"], hbm_bytes=32 * 2**20)
    monkeypatch.setitem(planner.CHIPS, "v5e", small)
    _, fv = parse(["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology",
                   "v5e:2x4", "--config.rl.packing=True", "--config.rl.pack_tokens=4096",
                   "--config.rl.max_new_tokens=480", "--config.model.d_model=256",
                   "--config.model.mlp_hidden=512"])
    report = planner.plan(fv.config, "v5e:2x4", programs=("update",), layer_cost=False)
    context = report["context"]
    assert [(t["context"], t["fits"]) for t in context["tried"]] == [(1, False), (2, True)]
    assert context["chosen"] == 2 and report["mesh"]["context"] == 2
    update = report["programs"][0]
    assert update.total_bytes <= small.hbm_bytes < context["tried"][0]["programs"]["update"][
        "total_bytes"]
    text = planner.format_report(report)
    assert "context parallelism (mesh.context): chose 2" in text and "fits: yes" in text
    assert "context 2 is the smallest size that fits" in text
    assert "mesh.context=2" in text  # the advice names the mesh to run with
    # Without the search the same config is reported as not fitting.
    off = planner.plan(fv.config, "v5e:2x4", programs=("update",), layer_cost=False,
                       choose_context=False)
    assert not planner.fits(off) and off["context"]["chosen"] == 1
    assert [key[2] for key in compiled] == [1, 2]  # context 1 and 2, each compiled once


@needs_libtpu
def test_plan_command_prints_the_long_tail_sampler_time_with_max_num_seqs(capsys):
    """rl.max_num_seqs > 0: `jaxrl-reason plan` itself prints the sampler's time on
    long-tailed lengths, static beside slot refill, under the HBM left beside the sampler
    (or --kv_budget_gib); without it, no such table."""
    args = ["jaxrl-reason", "plan", "--config", f"{ARITH}:smoke", "--topology", "v5e:2x4"]
    assert main(args + ["--config.rl.max_num_seqs=8", "--kv_budget_gib=0.5"]) == 0
    out = capsys.readouterr().out
    assert "sampler on long-tailed lengths (16 rows:" in out
    assert "KV budget 0.50 GiB per chip" in out
    assert "| static | 16 x 1 |" in out
    assert "| refill (8 slots asked, every 8 steps) | 8 slots" in out
    assert main(args + ["--config.rl.max_num_seqs=8", "--kv_budget_gib=-1"]) == 1
    assert "--kv_budget_gib=-1.0: must be > 0" in capsys.readouterr().err
