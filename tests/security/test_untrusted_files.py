"""Files from elsewhere: a downloaded run directory and a downloaded model directory.

Before: a `<workdir>/.lock` symlink made taking the lock truncate and overwrite the link's
target; a `config.json` with `rope_theta` NaN, `rms_norm_eps` inf or -1, `vocab_size` 1e13,
`max_position_embeddings` -5 or a NaN rope-scaling factor was accepted; a safetensors index
naming `../elsewhere/x.safetensors` was loaded from outside the model directory; a chat
template with nested `range(100000)` loops ran without end and `'A' * 400000000` rendered
410 MB. Nothing here downloads: every file is written by the test.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cli_runs import ARITH, QUIET, run_cli  # noqa: E402

from jaxrl_reason.checkpoints import workdir_lock  # noqa: E402
from jaxrl_reason.models import hf  # noqa: E402
from jaxrl_reason.models.config import get_preset  # noqa: E402
from jaxrl_reason.models.hf_config import hf_config, load_hf_config  # noqa: E402

PRECIOUS = "precious contents\n"


# ----------------------------------------------------------------- item 8: the workdir lock


@pytest.fixture
def victim(tmp_path):
    """A file outside the workdir that a hostile `.lock` points at."""
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text(PRECIOUS)
    return path


def refused(workdir, match: str):
    """Taking the lock of `workdir` raises UnsafeLockFile naming its .lock and `match`."""
    with pytest.raises(workdir_lock.UnsafeLockFile, match=match) as info:
        workdir_lock.acquire(str(workdir))
    assert str(workdir / ".lock") in str(info.value)
    assert workdir_lock.held() == []


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path, victim):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / ".lock").symlink_to(victim)
    before = victim.stat()
    refused(workdir, "symbolic link")
    assert victim.read_text() == PRECIOUS
    assert victim.stat().st_mtime_ns == before.st_mtime_ns


def test_a_dangling_symlinked_lock_creates_nothing(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    target = tmp_path / "created-by-the-lock"
    (workdir / ".lock").symlink_to(target)
    refused(workdir, "symbolic link")
    assert not target.exists()


def test_the_train_command_refuses_a_symlinked_lock(tmp_path, victim, capsys):
    """The whole run refuses, before anything else, with the path in its error."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / ".lock").symlink_to(victim)
    capsys.readouterr()
    rc = run_cli("train", "--config", f"{ARITH}:smoke", "--workdir", str(workdir), *QUIET)
    err = capsys.readouterr().err
    assert rc == 1 and "symbolic link" in err and str(workdir / ".lock") in err, err
    assert victim.read_text() == PRECIOUS
    assert sorted(os.listdir(workdir)) == [".lock"]


def test_a_hard_linked_lock_is_refused(tmp_path, victim):
    workdir = tmp_path / "run"
    workdir.mkdir()
    os.link(victim, workdir / ".lock")
    refused(workdir, "hard links")
    assert victim.read_text() == PRECIOUS


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_lock_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    workdir = tmp_path / "run"
    workdir.mkdir()
    if kind == "directory":
        (workdir / ".lock").mkdir()
    else:
        os.mkfifo(workdir / ".lock")
    refused(workdir, "not a regular file")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_lock_owned_by_another_user_is_refused(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    lock = workdir / ".lock"
    lock.write_text("{}")
    os.chown(lock, 12345, 12345)
    refused(workdir, "owned by uid 12345")
    assert lock.read_text() == "{}"


def test_an_ordinary_lock_still_works(tmp_path):
    workdir = tmp_path / "run"
    workdir_lock.acquire(str(workdir))
    try:
        assert json.loads((workdir / ".lock").read_text())["pid"] == os.getpid()
    finally:
        workdir_lock.release_all()
    workdir_lock.acquire(str(workdir))  # the file a released run left is taken over
    workdir_lock.release_all()


# ------------------------------------------------------------- item 9: a model's config.json


def model_dir(tmp_path, **changes):
    """A directory holding a small Llama `config.json` with `changes` applied (a value of
    `...` deletes the key)."""
    cj = hf_config(get_preset("llama3.2-1b", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2,
                              head_dim=16, mlp_hidden=128, vocab_size=256))
    for key, value in changes.items():
        if value is ...:
            cj.pop(key, None)
        else:
            cj[key] = value
    path = tmp_path / "model"
    path.mkdir(exist_ok=True)
    with open(path / "config.json", "w") as f:
        json.dump(cj, f)  # NaN and inf are written as the bare words HF's loader also reads
    return path


@pytest.mark.parametrize("field, value, why", [
    ("rope_theta", math.nan, "finite number > 0"),
    ("rope_theta", -1.0, "finite number > 0"),
    ("rms_norm_eps", math.inf, r"finite number in \(0, 1\)"),
    ("rms_norm_eps", -1.0, r"finite number in \(0, 1\)"),
    ("rms_norm_eps", 0.0, r"finite number in \(0, 1\)"),
    ("vocab_size", 1e13, "an integer"),
    ("vocab_size", 10**13, "between 1 and 16777216"),
    ("vocab_size", True, "an integer"),
    ("max_position_embeddings", -5, "between 1 and"),
    ("hidden_size", 0, "between 1 and"),
    ("num_attention_heads", 1.5, "an integer"),
    ("num_key_value_heads", -2, "between 1 and"),
    ("num_hidden_layers", 10**6, "between 1 and 4096"),
    ("intermediate_size", "128", "an integer"),
])
def test_a_bad_config_value_is_refused_naming_the_field_and_file(tmp_path, field, value, why):
    path = model_dir(tmp_path, **{field: value})
    with pytest.raises(ValueError, match=f"field '{field}' must be (a )?{why}") as info:
        load_hf_config(str(path))
    assert str(path / "config.json") in str(info.value)


@pytest.mark.parametrize("rope, field", [
    ({"rope_type": "linear", "factor": math.nan}, "rope_scaling.factor"),
    ({"rope_type": "linear", "factor": -2.0}, "rope_scaling.factor"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": math.inf,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     "rope_scaling.low_freq_factor"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": -1}, "rope_scaling.original_max_position_embeddings"),
])
def test_a_bad_rope_scaling_value_is_refused(tmp_path, rope, field):
    with pytest.raises(ValueError, match=f"config.json: field '{field}'"):
        load_hf_config(str(model_dir(tmp_path, rope_scaling=rope)))


def test_nested_rope_parameters_are_checked_too(tmp_path):
    """transformers 5's per-layer-type `rope_parameters` (Gemma 3)."""
    path = model_dir(tmp_path, rope_scaling=..., rope_theta=...,
                     rope_parameters={"full_attention": {"rope_type": "linear",
                                                         "factor": math.inf,
                                                         "rope_theta": 1e6}})
    with pytest.raises(ValueError, match="rope_parameters.full_attention.factor"):
        load_hf_config(str(path))


def test_gemma_softcaps_and_text_config_are_checked(tmp_path):
    cj = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "final_logit_softcapping": math.nan}}
    (tmp_path / "config.json").write_text(json.dumps(cj))
    with pytest.raises(ValueError, match=r"\(text_config\): field 'final_logit_softcapping'"):
        load_hf_config(str(tmp_path))


def test_a_deeply_nested_config_is_a_value_error(tmp_path):
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="config.json: not valid JSON"):
        load_hf_config(str(tmp_path))


def test_a_sound_config_still_loads(tmp_path):
    cfg = load_hf_config(str(model_dir(tmp_path)))
    assert cfg.vocab_size == 256 and cfg.rope_theta > 0


# -------------------------------------------------------- item 9: the safetensors index


def write_tensor(path) -> None:
    """A one-tensor safetensors file at `path`."""
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": np.zeros((4, 2), np.float32)}, str(path))


def write_index(model, entry: str) -> str:
    index = model / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {
        "model.embed_tokens.weight": entry}}))
    return str(index)


@pytest.mark.parametrize("entry", ["../elsewhere/x.safetensors", "/tmp/x.safetensors",
                                   "sub/../../elsewhere/x.safetensors", "./x.safetensors",
                                   ""])
def test_index_entries_outside_the_model_directory_are_refused(tmp_path, entry):
    write_tensor(tmp_path / "elsewhere" / "x.safetensors")
    model = tmp_path / "model"
    model.mkdir()
    index = write_index(model, entry)
    with pytest.raises(ValueError, match="weight_map entry") as info:
        hf._Checkpoint(str(model))
    assert index in str(info.value)


def test_a_symlink_escaping_the_model_directory_is_refused(tmp_path):
    write_tensor(tmp_path / "elsewhere" / "x.safetensors")
    model = tmp_path / "model"
    model.mkdir()
    (model / "model-00001-of-00001.safetensors").symlink_to(
        tmp_path / "elsewhere" / "x.safetensors")
    write_index(model, "model-00001-of-00001.safetensors")
    with pytest.raises(ValueError, match="resolves to .*outside the model directory"):
        hf._Checkpoint(str(model))
    os.remove(model / "model.safetensors.index.json")
    os.rename(model / "model-00001-of-00001.safetensors", model / "model.safetensors")
    with pytest.raises(ValueError, match="outside the model directory"):
        hf._Checkpoint(str(model))  # the single-file layout too


def test_an_index_entry_inside_the_directory_and_the_hf_cache_layout_load(tmp_path):
    model = tmp_path / "model"
    write_tensor(model / "shards" / "a.safetensors")
    write_index(model, "shards/a.safetensors")
    assert hf._Checkpoint(str(model)).location == {
        "model.embed_tokens.weight": "shards/a.safetensors"}
    # huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
    repo = tmp_path / "hub" / "models--org--tiny"
    write_tensor(repo / "blobs" / "0123abcd")
    snapshot = repo / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/0123abcd")
    assert "model.embed_tokens.weight" in hf._Checkpoint(str(snapshot)).info


# ------------------------------------------------------------- item 9: the chat template


def hostile_tokenizer(template: str):
    """A tokenizer object whose chat template is `template` (no files, no library)."""
    from jaxrl_reason.tokenizers.hf import HFTokenizer

    tok = HFTokenizer.__new__(HFTokenizer)
    tok.source, tok.chat_template = "downloaded-model", template
    for name in ("bos", "eos", "unk", "pad"):
        setattr(tok, f"{name}_token", None)
    return tok


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("template, why", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "took more than"),
    ("{% set s = 'a' * 100000 %}{% for c in s %}{% for d in s %}{% endfor %}{% endfor %}",
     "took more than"),
    ("{{ 'A' * 400000000 }}", "repeated str"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s }}", "concatenated string"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}{{ ns.s }}", "concatenated str"),
    ("{{ ''|center(999999999) }}", "center width"),
    ("{{ 'a'.ljust(999999999) }}", "argument of ljust"),
    ("{{ '%0999999999d' % 1 }}", "seven digits"),
    ("{{ '{:>999999999}'.format(1) }}", "seven digits"),
    ("{% set s = 'a' * 100000 %}{{ s|replace('a', s) }}", "replaced string"),
    ("{{ 9 ** 999999 }}", "power over"),
    ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", "rendered prompt"),
    # a block that piles up references to one string, then joins them
    ("{% set big = 'x' * 1000000 %}{% set x %}{% for i in range(100000) %}{{ big }}"
     "{% endfor %}{% endset %}{{ x|length }}", "produced more than"),
    ("{% set big = 'x' * 999999 %}{% macro m() %}{{ big }}{% endmacro %}"
     "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [m()] %}"
     "{% endfor %}", "produced more than"),
])
def test_a_chat_template_is_bounded_in_time_and_size(template, why):
    from jaxrl_reason.tokenizers import apply_chat_template, chat_limits

    start = time.monotonic()
    with pytest.raises(ValueError, match=f"chat template of downloaded-model: .*{why}"):
        apply_chat_template(hostile_tokenizer(template), MESSAGES)
    assert time.monotonic() - start < chat_limits.MAX_RENDER_S + 3.0


def test_runaway_recursion_is_a_value_error():
    from jaxrl_reason.tokenizers import apply_chat_template

    with pytest.raises(ValueError, match="RecursionError"):
        apply_chat_template(hostile_tokenizer(
            "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}"), MESSAGES)


def test_an_ordinary_template_renders_as_before():
    from jaxrl_reason.tokenizers import apply_chat_template

    template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content ~ '\n' }}"
                "{% if loop.last %}[{{ loop.index }}/{{ loop.length }}]{% endif %}{% endfor %}"
                "{{ '%s-%d' % ('a', 3) }}{{ 'x'|center(5) }}{{ [1, 2]|join(',') }}"
                "{{ '{:>3}'.format(7) }}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    out = apply_chat_template(hostile_tokenizer(template),
                              MESSAGES + [{"role": "assistant", "content": "yo"}])
    assert out == "<|user|>hi\n<|assistant|>yo\n[2/2]a-3  x  1,2  7<|assistant|>"
