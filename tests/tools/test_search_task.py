"""The search_facts task: its world and corpus, disjoint splits, SFT traces whose result
blocks are exactly what the tools return, the exact_match / tool_use rewards, the config's
validation, and the runtime it builds (tool tags as single tokens, a tool sampler)."""
import collections
import json
import math
import os
import re

import pytest

from jaxrl_reason.config.files import sibling_config
from jaxrl_reason.data import search_facts as sf
from jaxrl_reason.data.tasks import get_task, task_source, task_verifier
from jaxrl_reason.rewards.tool_use import exact_match, normalize_answer, tool_use
from jaxrl_reason.tools import build_tool_runner
from jaxrl_reason.config.validation import validate_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CALL = re.compile(r"</(search|calc)><result>(.*?)</result>")


def config(arg=None):
    return sibling_config(os.path.join(REPO, "configs", "x.py"), "search_grpo").get_config(arg)


def test_world_and_corpus():
    world = sf.world()
    assert len(world) == sf.NUM_ENTITIES
    names = [c[k] for c in world for k in ("name", "capital", "leader", "river")]
    assert len(set(names)) == len(names)  # every answer names exactly one thing
    docs = sf.corpus_documents()
    assert len(docs) == 4 * sf.NUM_ENTITIES and docs[0].startswith("The capital of ")
    splits = collections.Counter(sf.entity_split(c["name"]) for c in world)
    assert 0.15 < splits["eval"] / len(world) < 0.25


def test_examples_are_deterministic_and_split_by_entity():
    train = task_source(config(), "train", (1, 2), 400, seed=0)
    held_out = task_source(config(), "eval", (1, 2), 200, seed=0)
    assert train[7] == task_source(config(), "train", (1, 2), 400, seed=0)[7]
    assert not {e["entity"] for e in train} & {e["entity"] for e in held_out}
    assert {e["level"] for e in train} == {1, 2} and get_task("search_facts").max_level == 2
    assert task_verifier(config()) == "exact_match"
    by_name = {c["name"]: c for c in sf.world()}
    for e in list(train)[:40]:
        country = by_name[e["entity"]]
        if e["level"] == 1:
            assert e["answer"] == country[e["relation"]] and e["entity"] in e["prompt"]
        else:
            years = int(re.search(r"turn (\d+) years", e["prompt"]).group(1))
            assert int(e["answer"]) == country["founded"] + years


def test_traces_hold_what_the_tools_return():
    """Replaying every call of the tool traces through the configured runner gives the very
    result blocks of the traces, and the traces earn the rewards."""
    runner = build_tool_runner(config().tools)
    source = sf.SearchFactsSource("train", (1, 2), 60, seed=3, tool_fraction=1.0)
    for example in source:
        text, calls = example["completion"], list(_CALL.finditer(example["completion"]))
        assert len(calls) == example["level"]
        for call in calls:
            result = runner.run(text[:call.start() + len(f"</{call.group(1)}>")])
            assert result.error is None and result.text == f"<result>{call.group(2)}</result>"
        assert exact_match(text, example).score == 1.0 and tool_use(text, example).score == 1.0
    memory = sf.make_example("train", 1, 0, 3, tool_fraction=0.0)
    assert "<search>" not in memory["completion"] and not memory["uses_tool"]
    assert exact_match(memory["completion"], memory).score == 1.0
    assert tool_use(memory["completion"], memory).reason == "no_call"


def test_tool_demo_fraction():
    source = task_source(config(), "train", (1,), 2000, seed=0)
    assert 0.22 < sum(e["uses_tool"] for e in source) / len(source) < 0.28
    c = config()
    c.task.tool_demo_fraction = 0.0
    assert not any(e["uses_tool"] for e in task_source(c, "train", (1,), 200, seed=0))


def test_exact_match():
    example = {"answer": "Orbe", "prompt": "?"}
    assert exact_match("<answer> the  orbe. </answer>", example).score == 1.0
    assert exact_match("<answer>Orbes</answer>", example).reason == "wrong"
    assert exact_match("<result>Orbe</result>", example).reason == "no_answer"
    assert exact_match("<answer>x</answer><answer>Orbe</answer>", example).score == 1.0
    assert exact_match(None, example).reason == "no_answer"
    assert normalize_answer("  The\nMain  River!") == "main river"


def test_config_validation():
    assert validate_config(config(), 1) == [] and validate_config(config("smoke"), 1) == []
    c = config("smoke")
    c.tools.shell = True
    c.rl.kl_in_reward = True
    c.task.tool_demo_fraction = 1.5
    problems = validate_config(c, 1)
    for key in ("tools.shell: unknown key", "rl.kl_in_reward: not supported with tools",
                "task.tool_demo_fraction:"):
        assert any(p.startswith(key) for p in problems), (key, problems)
    c = config("smoke")
    c.tools.enabled = False
    c.tools.names = ("shell",)  # a disabled block is not checked
    assert validate_config(c, 1) == []


def test_runtime_uses_tools(tmp_path):
    from jaxrl_reason.runtime.build import build_runtime
    from jaxrl_reason.sampling.tool_loop import ToolSampler

    rt = build_runtime(config("smoke"), str(tmp_path))
    for tag in ("<search>", "</search>", "<calc>", "</calc>", "<result>", "</result>",
                "<think>"):
        assert len(rt.tokenizer.encode(tag)) == 1, tag
    assert isinstance(rt.sampler, ToolSampler)
    assert rt.sampler.closers == ((rt.tokenizer.encode("</search>")[0],),
                                  (rt.tokenizer.encode("</calc>")[0],))
    example = sf.make_example("train", 1, 0, 0, tool_fraction=1.0)
    ids = rt.tokenizer.encode(example["completion"])
    assert rt.tokenizer.decode(ids) == example["completion"]


@pytest.mark.slow
def test_tool_rollouts_with_dynamic_sampling_train(tmp_path):
    """DAPO's dynamic sampling merges groups of several tool-use rollouts; each kept row keeps
    its result-token mask (tests/rl/test_trainer.py checks the merge), and the run trains."""
    from jaxrl_reason import cli

    workdir = tmp_path / "run"
    rc = cli.main(["jaxrl-reason", "train", "--config",
                   os.path.join(REPO, "configs", "search_grpo.py:smoke"), "--workdir",
                   str(workdir), "--config.rl.dynamic_sampling=True",
                   "--config.rl.dynamic_sampling_max_rounds=2", "--config.rl.steps=2",
                   "--config.log.progress_bar=False", "--config.eval.num_problems=4"])
    assert rc == 0
    with open(workdir / "metrics.jsonl") as f:
        rl = [m for m in map(json.loads, f) if m["phase"] == "rl"]
    assert [m["step"] for m in rl] == [1, 2]
    for m in rl:
        assert 0 <= m["dynamic_sampling/extra_rounds"] <= 2
        assert 0.0 <= m["reward/tool_use"] <= 1.0 and math.isfinite(m["loss"])
