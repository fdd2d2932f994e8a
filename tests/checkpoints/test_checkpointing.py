"""Tests of jaxrl_reason.checkpoints.checkpointer on 8 fake CPU devices."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from checkpoint_damage import damage
from jaxrl_reason.checkpoints import manifest as checkpoint_manifest
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.checkpoints.manifest import MANIFEST_NAME, CheckpointCorruptError, abstract_like


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


def make_state(mesh, seed=0):
    """A small training state: sharded params, adamw state, rng key data, step."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = {
        "w": jax.device_put(jax.random.normal(k1, (16, 4)), NamedSharding(mesh, P("data"))),
        "b": jax.device_put(jax.random.normal(k2, (4,)), NamedSharding(mesh, P())),
    }
    opt_state = optax.adamw(1e-3).init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = optax.adamw(1e-3).update(grads, opt_state, params)
    return {
        "params": params,
        "opt_state": opt_state,
        "rng": jax.random.key_data(jax.random.key(seed + 100)),
        "step": np.asarray(7, np.int32),
    }


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


META = {"phase": "grpo", "config": {"lr": 1e-3, "buckets": [64, 128]},
        "data_state": b"\x00\x01grain-state\xff", "wall_time": 12.5}


def test_roundtrip_keeps_structure_values_sharding_and_metadata(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path / "ck")) as ckpt:
        assert ckpt.save(5, state, META)
        restored, meta = ckpt.restore(abstract_state=abstract_like(state))
    assert isinstance(restored["opt_state"][0], optax.ScaleByAdamState)
    assert_trees_equal(restored, state)
    assert restored["params"]["w"].sharding == state["params"]["w"].sharding
    assert restored["opt_state"][0].mu["w"].sharding == NamedSharding(mesh, P("data"))
    assert isinstance(restored["step"], np.ndarray)
    assert meta == META and isinstance(meta["data_state"], bytes)


def test_rng_key_data_roundtrip(tmp_path, mesh):
    state = make_state(mesh)
    key = jax.random.key(42)
    state["rng"] = jax.random.key_data(key)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state, {})
        restored, _ = ckpt.restore(1, abstract_state=abstract_like(state))
    new_key = jax.random.wrap_key_data(restored["rng"])
    np.testing.assert_array_equal(jax.random.uniform(new_key, (3,)),
                                  jax.random.uniform(key, (3,)))


def test_typed_key_is_rejected_before_writing(tmp_path, mesh):
    state = make_state(mesh)
    state["rng"] = jax.random.key(0)
    with Checkpointer(str(tmp_path / "ck")) as ckpt:
        with pytest.raises(TypeError, match="key_data"):
            ckpt.save(1, state, {})
        assert ckpt.all_steps() == []


def test_restore_into_a_different_sharding(tmp_path, mesh):
    state = make_state(mesh)
    replicated = NamedSharding(mesh, P())
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(3, state, {})
        restored, _ = ckpt.restore(abstract_state=abstract)
    assert restored["params"]["w"].sharding == replicated
    assert restored["step"].sharding == replicated
    assert_trees_equal(restored, state)


def test_keep_last_k_and_interval(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path), max_to_keep=2, save_interval_steps=2) as ckpt:
        assert ckpt.latest_step() is None
        # The first save into an empty directory always happens (orbax InitialSavePolicy).
        assert [ckpt.save(s, state, {"s": s}) for s in range(1, 7)] == [
            True, True, False, True, False, True]
        assert ckpt.save(7, state, {"s": 7}, force=True)
        assert ckpt.all_steps() == [6, 7]
        _, meta = ckpt.restore(6, abstract_state=abstract_like(state))
    assert meta == {"s": 6}
    assert sorted(d for d in os.listdir(tmp_path) if d.isdigit()) == ["6", "7"]


def test_empty_and_missing_directories(tmp_path, mesh):
    state = make_state(mesh)
    missing = tmp_path / "nope"
    ckpt = Checkpointer(str(missing))
    assert ckpt.latest_step() is None and ckpt.all_steps() == []
    with pytest.raises(FileNotFoundError, match="nope.*does not exist"):
        ckpt.restore(abstract_state=abstract_like(state))
    ckpt.close()
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    with Checkpointer(str(tmp_path / "empty")) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
            ckpt.restore(abstract_state=abstract_like(state))


def test_missing_step_names_available_steps_and_deletes_nothing(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state, {})
        ckpt.save(2, state, {})
        before = sorted(os.walk(tmp_path))
        with pytest.raises(FileNotFoundError, match=r"step 9 .*does not exist.*\[1, 2\]"):
            ckpt.restore(9, abstract_state=abstract_like(state))
        assert sorted(os.walk(tmp_path)) == before


@pytest.mark.parametrize("damage", ["delete", "corrupt", "wrong_step"])
def test_step_without_valid_manifest_is_skipped(tmp_path, mesh, damage):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state, {"s": 1})
        ckpt.save(2, state, {"s": 2})
    manifest = tmp_path / "2" / MANIFEST_NAME
    if damage == "delete":
        manifest.unlink()
    elif damage == "corrupt":
        manifest.write_text(manifest.read_text()[:20])
    else:
        manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), step=1)))
    with Checkpointer(str(tmp_path)) as ckpt:
        assert ckpt.all_steps() == [1] and ckpt.latest_step() == 1
        _, meta = ckpt.restore(abstract_state=abstract_like(state))
        assert meta == {"s": 1}
        with pytest.raises(FileNotFoundError, match="no valid"):
            ckpt.restore(2, abstract_state=abstract_like(state))
        assert (tmp_path / "2").exists()


def test_incomplete_step_from_earlier_run_is_moved_aside_on_save(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state, {"s": 1})
        ckpt.save(2, state, {"s": 2})
    (tmp_path / "2" / MANIFEST_NAME).unlink()
    with Checkpointer(str(tmp_path)) as ckpt:
        assert ckpt.save(2, state, {"s": "again"})
        assert ckpt.all_steps() == [1, 2]
        _, meta = ckpt.restore(abstract_state=abstract_like(state))
    assert meta == {"s": "again"}
    assert (tmp_path / "2.incomplete").is_dir()


def test_manifest_lists_arrays_and_metadata_checksum(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(4, state, META)
    manifest = json.loads((tmp_path / "4" / MANIFEST_NAME).read_text())
    assert manifest["step"] == 4
    entries = {e["path"]: e for e in manifest["arrays"]}
    assert entries["['params']['w']"] == {"path": "['params']['w']", "shape": [16, 4],
                                           "dtype": "float32"}
    assert entries["['rng']"]["dtype"] == "uint32"
    assert manifest["metadata_sha256"] == checkpoint_manifest.metadata_checksum(
        checkpoint_manifest.encode_metadata(META))


def test_tampered_metadata_fails_checksum(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state, {"phase": "sft"})
    meta_files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "1" / "metadata")
                  for f in fs if "sft" in open(os.path.join(d, f), errors="ignore").read()]
    assert meta_files
    with open(meta_files[0], "w") as f:
        json.dump({"phase": "grpo"}, f)
    with Checkpointer(str(tmp_path)) as ckpt:
        with pytest.raises(ValueError, match=r"step 1 .*metadata/metadata: 17 bytes"):
            ckpt.restore(1, abstract_state=abstract_like(state))
    # A format-1 manifest (no file list) still catches it by the metadata checksum.
    to_v1_manifest(tmp_path / "1")
    with Checkpointer(str(tmp_path)) as ckpt:
        with pytest.raises(ValueError, match="metadata checksum"):
            ckpt.restore(1, abstract_state=abstract_like(state))


def test_mismatched_abstract_state_is_a_clear_error(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(1, state, {})
        wrong = abstract_like(state)
        wrong["params"]["b"] = jax.ShapeDtypeStruct((5,), jnp.float32)
        del wrong["rng"]
        with pytest.raises(ValueError) as err:
            ckpt.restore(abstract_state=wrong)
    assert "missing from abstract_state: ['rng']" in str(err.value)
    assert "shape of ['params']['b']: saved [4], requested [5]" in str(err.value)


def test_save_rejects_old_steps_and_bad_metadata(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path)) as ckpt:
        ckpt.save(3, state, {})
        with pytest.raises(ValueError, match="not after the latest saved step 3"):
            ckpt.save(2, state, {})
        with pytest.raises(ValueError, match="not after the latest saved step 3"):
            ckpt.save(3, state, {}, force=True)
        assert not ckpt.save(3, state, {})  # a resumed run saving its restored step again
        with pytest.raises(TypeError, match=r"metadata\['x'\].*set"):
            ckpt.save(4, state, {"x": {1, 2}})
        with pytest.raises(TypeError, match="non-str key"):
            ckpt.save(4, state, {"x": {1: "a"}})
        with pytest.raises(TypeError, match=r"\['params'\]\['name'\].*str"):
            ckpt.save(4, {"params": {"name": "w"}}, {})
        with pytest.raises(ValueError, match="step must be"):
            ckpt.save(-1, state, {})
        assert ckpt.all_steps() == [3]


def test_async_save_writes_manifest_after_finalize(tmp_path, mesh):
    state = make_state(mesh)
    with Checkpointer(str(tmp_path), async_save=True) as ckpt:
        assert ckpt.save(1, state, {"s": 1})
        assert ckpt.save(2, state, {"s": 2})
        assert (tmp_path / "1" / MANIFEST_NAME).exists()
        ckpt.wait_until_finished()
        assert (tmp_path / "2" / MANIFEST_NAME).exists()
        restored, meta = ckpt.restore(abstract_state=abstract_like(state))
    assert meta == {"s": 2}
    assert_trees_equal(restored, state)


def test_metadata_encoding_roundtrip():
    meta = {"a": [1, (2, b"x")], "b": {"c": None, "d": np.float32(0.5)}}
    encoded = checkpoint_manifest.encode_metadata(meta)
    assert json.loads(json.dumps(encoded)) == encoded
    assert checkpoint_manifest.decode_metadata(encoded) == {"a": [1, [2, b"x"]],
                                                      "b": {"c": None, "d": 0.5}}
    with pytest.raises(TypeError, match="must be a dict"):
        checkpoint_manifest.encode_metadata([1])


_TWO_PROCESS_WORKER = r'''
import sys
pid, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=pid)
from jaxrl_reason.checkpoints.checkpointer import Checkpointer
from jaxrl_reason.checkpoints.manifest import abstract_like
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
full = np.arange(32, dtype=np.float32).reshape(8, 4)
w = jax.make_array_from_callback((8, 4), NamedSharding(mesh, P("data")), lambda i: full[i])
state = {"w": w, "step": np.asarray(3, np.int32)}
with Checkpointer(directory) as ckpt:
    assert ckpt.save(1, state, {"b": b"xy"})
with Checkpointer(directory, async_save=True) as ckpt:
    assert ckpt.save(2, state, {"b": b"z"})
with Checkpointer(directory) as ckpt:
    assert ckpt.all_steps() == [1, 2], ckpt.all_steps()
    restored, meta = ckpt.restore(1, abstract_state=abstract_like(state))
    assert meta == {"b": b"xy"}, meta
    for shard in restored["w"].addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), full[shard.index])
    replicated = NamedSharding(mesh, P())
    restored, meta = ckpt.restore(abstract_state={
        "w": jax.ShapeDtypeStruct((8, 4), np.float32, sharding=replicated),
        "step": jax.ShapeDtypeStruct((), np.int32)})
    assert restored["w"].sharding == replicated and meta == {"b": b"z"}
    np.testing.assert_array_equal(np.asarray(restored["w"].addressable_data(0)), full)
print("WORKER_OK", pid, flush=True)
jax.distributed.shutdown()
'''


def test_two_processes_share_a_checkpoint(tmp_path):
    """Two JAX processes (4 CPU devices each) save and restore one globally sharded array."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    procs = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESS_WORKER, str(pid), str(port),
                               str(tmp_path / "ck")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for pid in range(2)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for pid, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"WORKER_OK {pid}" in out, out[-3000:]


def test_partial_restore_reads_only_the_requested_subtree(tmp_path):
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones((3,))}
    state = {"train_state": {"params": params, "opt_state": {"mu": jnp.zeros((2, 3))}},
             "rng": np.arange(2, dtype=np.uint32)}
    with Checkpointer(str(tmp_path / "ck")) as ckpt:
        ckpt.save(3, state, {"phase": "sft", "blob": b"\x00\x01"})
    with Checkpointer(str(tmp_path / "ck")) as ckpt:
        assert ckpt.metadata(3) == {"phase": "sft", "blob": b"\x00\x01"}
        target = {"train_state": {"params": abstract_like(params)}}
        tree, meta = ckpt.restore(3, abstract_state=target, partial=True)
        assert set(tree) == {"train_state"} and set(tree["train_state"]) == {"params"}
        np.testing.assert_array_equal(tree["train_state"]["params"]["w"], params["w"])
        with pytest.raises(ValueError, match="not in the checkpoint"):
            ckpt.restore(3, abstract_state={"nope": abstract_like(params)}, partial=True)


# ---------------------------------------------------------------- damaged checkpoints


def to_v1_manifest(step_dir):
    """Rewrites a step's manifest as format 1 (no file list), as older versions wrote it."""
    path = step_dir / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    del manifest["files"]
    path.write_text(json.dumps(dict(manifest, format=1)))


def save_steps(directory, state, steps=(1, 2, 3), **kwargs):
    with Checkpointer(str(directory), **kwargs) as ckpt:
        for s in steps:
            assert ckpt.save(s, state, {"s": s})


EXPECTED = {"truncate": "truncated", "flip": "SHA-256", "bad_json": "bytes",
            "bad_orbax_metadata": "bytes", "missing": "missing", "extra": "unexpected file"}


@pytest.mark.parametrize("how", sorted(EXPECTED))
def test_damaged_newest_step_falls_back_with_a_warning(tmp_path, mesh, how, caplog):
    state = make_state(mesh)
    save_steps(tmp_path, state)
    rel = damage(tmp_path / "3", how)
    before = sorted((d, sorted(fs)) for d, _, fs in os.walk(tmp_path))
    with Checkpointer(str(tmp_path)) as ckpt:
        assert ckpt.latest_step() == 3  # cheap: manifests only
        problems = ckpt.verify(3)
        assert len(problems) == 1 and problems[0].startswith(rel + ": ")
        assert EXPECTED[how] in problems[0]
        assert ckpt.verify(2) == []
        with caplog.at_level("WARNING", logger="jaxrl_reason.checkpoints.checkpointer"):
            restored, meta = ckpt.restore(abstract_state=abstract_like(state))
        assert meta == {"s": 2} and ckpt.last_restored_step == 2
        assert list(ckpt.last_skipped) == [3] and rel in ckpt.last_skipped[3][0]
        assert_trees_equal(restored, state)
        assert ckpt.latest_good_step() == 2
        # metadata() checks the metadata files only.
        assert ckpt.metadata() == {"s": 2 if how == "bad_json" else 3}
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert f"step 3 at {tmp_path / '3'} is damaged" in warning and rel in warning
    assert "falling back to step 2" in warning
    # Nothing was deleted, moved or rewritten.
    assert sorted((d, sorted(fs)) for d, _, fs in os.walk(tmp_path)) == before


@pytest.mark.parametrize("how,expected", [("truncate", "orbax could not restore"),
                                          ("bad_json", "orbax could not read"),
                                          ("bad_orbax_metadata", "orbax could not restore")])
def test_v1_manifest_falls_back_on_orbax_errors(tmp_path, mesh, how, expected, caplog):
    """Format-1 manifests (no file list) still load; their damage shows in orbax's restore."""
    state = make_state(mesh)
    save_steps(tmp_path, state)
    for s in (1, 2, 3):
        to_v1_manifest(tmp_path / str(s))
    damage(tmp_path / "3", how)
    with Checkpointer(str(tmp_path)) as ckpt:
        assert ckpt.all_steps() == [1, 2, 3] and ckpt.verify(3) == []  # unverifiable
        with caplog.at_level("WARNING", logger="jaxrl_reason.checkpoints.checkpointer"):
            restored, meta = ckpt.restore(abstract_state=abstract_like(state))
        assert meta == {"s": 2} and ckpt.last_restored_step == 2
        assert expected in ckpt.last_skipped[3][0]
        assert_trees_equal(restored, state)
    assert "step 3" in caplog.text and expected in caplog.text


def test_v1_manifest_loads(tmp_path, mesh):
    state = make_state(mesh)
    save_steps(tmp_path, state, steps=(1,))
    to_v1_manifest(tmp_path / "1")
    with Checkpointer(str(tmp_path)) as ckpt:
        assert ckpt.latest_step() == 1 and ckpt.verify(1) == []
        restored, meta = ckpt.restore(1, abstract_state=abstract_like(state))
        assert meta == {"s": 1} and ckpt.last_skipped == {}
        assert_trees_equal(restored, state)
        # New saves write format 2 next to it.
        ckpt.save(2, state, {"s": 2})
    assert json.loads((tmp_path / "2" / MANIFEST_NAME).read_text())["format"] == 2


def test_explicit_damaged_step_is_an_error_without_fallback(tmp_path, mesh):
    state = make_state(mesh)
    save_steps(tmp_path, state)
    rel = damage(tmp_path / "3", "truncate")
    with Checkpointer(str(tmp_path)) as ckpt:
        with pytest.raises(CheckpointCorruptError) as err:
            ckpt.restore(3, abstract_state=abstract_like(state))
        assert ckpt.last_restored_step is None
        _, meta = ckpt.restore(2, abstract_state=abstract_like(state))
        assert meta == {"s": 2}
    assert f"step 3 at {tmp_path / '3'} is damaged: {rel}: " in str(err.value)
    assert "truncated" in str(err.value) and list(err.value.problems) == [3]


def test_every_step_damaged_is_a_clear_error(tmp_path, mesh):
    state = make_state(mesh)
    save_steps(tmp_path, state)
    names = {3: damage(tmp_path / "3", "truncate"), 2: damage(tmp_path / "2", "flip"),
             1: damage(tmp_path / "1", "bad_json")}
    with Checkpointer(str(tmp_path)) as ckpt:
        with pytest.raises(CheckpointCorruptError) as err:
            ckpt.restore(abstract_state=abstract_like(state))
        assert ckpt.latest_good_step() is None
        assert sorted(ckpt.bad_steps) == [1, 2, 3]
    text = str(err.value)
    assert f"no usable checkpoint in {tmp_path}: all 3 complete steps are damaged" in text
    for s, rel in names.items():
        assert f"step {s} at {tmp_path / str(s)}: {rel}: " in text
    assert list(err.value.problems) == [3, 2, 1]
    assert sorted(os.listdir(tmp_path)) == ["1", "2", "3"]


def test_save_after_fallback_moves_the_damaged_step_aside(tmp_path, mesh):
    """A resumed run re-saves the damaged step's number; retention keeps working."""
    state = make_state(mesh)
    save_steps(tmp_path, state, max_to_keep=3)
    damage(tmp_path / "3", "truncate")
    with Checkpointer(str(tmp_path), max_to_keep=3) as ckpt:
        ckpt.restore(abstract_state=abstract_like(state))
        assert ckpt.last_restored_step == 2
        assert ckpt.save(3, state, {"s": "3 again"}, force=True)
        assert (tmp_path / "3.corrupt").is_dir() and ckpt.verify(3) == []
        for s in (4, 5, 6):
            assert ckpt.save(s, state, {"s": s})
        assert ckpt.all_steps() == [4, 5, 6]
    assert sorted(os.listdir(tmp_path)) == ["3.corrupt", "4", "5", "6"]
    # The damaged step was kept as it was, for inspection.
    assert (tmp_path / "3.corrupt" / MANIFEST_NAME).exists()


def test_save_past_a_damaged_step_leaves_it_and_prunes(tmp_path, mesh):
    state = make_state(mesh)
    save_steps(tmp_path, state, max_to_keep=2)
    damage(tmp_path / "3", "bad_json")
    with Checkpointer(str(tmp_path), max_to_keep=2) as ckpt:
        ckpt.restore(abstract_state=abstract_like(state))
        assert ckpt.last_restored_step == 2
        assert ckpt.save(4, state, {"s": 4})
        assert (tmp_path / "3").is_dir()  # not in the way: left where it is
        assert ckpt.save(5, state, {"s": 5})
        assert ckpt.all_steps() == [4, 5]  # ordinary retention
        _, meta = ckpt.restore(abstract_state=abstract_like(state))
        assert meta == {"s": 5} and ckpt.last_skipped == {}


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path, mesh):
    import hashlib

    state = make_state(mesh)
    save_steps(tmp_path, state, steps=(1,))
    (tmp_path / "1" / "notes.txt").write_text("extra files next to the items are fine")
    manifest = json.loads((tmp_path / "1" / MANIFEST_NAME).read_text())
    assert manifest["format"] == 2
    on_disk = {os.path.relpath(os.path.join(d, f), tmp_path / "1")
               for d, _, fs in os.walk(tmp_path / "1") for f in fs}
    assert {e["path"] for e in manifest["files"]} == on_disk - {MANIFEST_NAME, "notes.txt"}
    for e in manifest["files"]:
        data = (tmp_path / "1" / e["path"]).read_bytes()
        assert e["size"] == len(data) and e["sha256"] == hashlib.sha256(data).hexdigest()
    with Checkpointer(str(tmp_path)) as ckpt:
        assert ckpt.verify(1) == [] and ckpt.verify(1, items=("metadata",)) == []
        assert ckpt.verify(7) == [f"step directory {tmp_path / '7'} does not exist"]


def test_run_state_resume_and_load_params_fall_back(tmp_path, capsys):
    import types

    from jaxrl_reason.checkpoints import phases as run_state
    from jaxrl_reason.runtime import sharding
    from jaxrl_reason.models.config import get_preset
    from jaxrl_reason.models.params import init_params
    from jaxrl_reason.tokenizers import train_tokenizer
    from jaxrl_reason.runtime.train_state import create_train_state, make_optimizer

    mesh1 = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
    cfg = get_preset("test")
    config = types.SimpleNamespace(checkpoint=types.SimpleNamespace(max_to_keep=3),
                                   to_json_best_effort=lambda: "{}")
    rt = types.SimpleNamespace(workdir=str(tmp_path), config=config, model_cfg=cfg, mesh=mesh1,
                               tokenizer=train_tokenizer(["1+2=3", "abc def"], 280))
    optimizer = make_optimizer(1e-3, weight_decay=0.0, max_grad_norm=1.0)
    base = init_params(cfg, jax.random.key(0), mesh1, sharding.DEFAULT_RULES)
    params = {s: jax.tree.map(lambda x, s=s: x + s, base) for s in (1, 2, 3)}
    ckpt = run_state.PhaseCheckpointer(rt, "sft")
    for s in (1, 2, 3):
        state = create_train_state(params[s], optimizer)
        ckpt.save(s, state, {"pos": s}, extra_meta={"tag": s})
    ckpt.close()
    sft_dir = tmp_path / "checkpoints" / "sft"
    rel = damage(sft_dir / "3", "flip")

    loaded, model_cfg, tok, meta = run_state.load_params(str(tmp_path), mesh1,
                                                         sharding.DEFAULT_RULES)
    assert meta["tag"] == 2 and model_cfg == cfg and tok.vocab_size == 280
    assert_trees_equal(loaded, params[2])
    err = capsys.readouterr().err
    assert f"skipped damaged step(s) [3] in {sft_dir}" in err and rel in err
    assert "using step 2" in err
    with pytest.raises(CheckpointCorruptError, match=f"step 3 at {sft_dir / '3'}"):
        run_state.load_params(str(tmp_path), mesh1, sharding.DEFAULT_RULES, step=3)

    ckpt = run_state.PhaseCheckpointer(rt, "sft")
    template = create_train_state(params[1], optimizer)
    state, meta = ckpt.restore_latest(template)
    assert meta["tag"] == 2 and ckpt.restored_step == 2
    assert_trees_equal(state.params, params[2])
    assert "resuming sft: skipped damaged step(s) [3]" in capsys.readouterr().err
    ckpt.save(3, state, {"pos": 3}, extra_meta={"tag": "3 again"})  # the resumed run goes on
    ckpt.close()
    assert (sft_dir / "3.corrupt").is_dir()
    _, _, _, meta = run_state.load_params(str(tmp_path), mesh1, sharding.DEFAULT_RULES)
    assert meta["tag"] == "3 again" and capsys.readouterr().err == ""
