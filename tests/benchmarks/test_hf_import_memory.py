"""benchmarks/hf_import_memory.py --quick: the synthetic checkpoint it writes, and the JSON of
host-memory figures its import subprocesses report. Behaviour only: no memory bound is
asserted (a few-MB import is dominated by allocator noise)."""
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "hf_import_memory.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import hf_import_memory  # noqa: E402


def test_synthetic_checkpoint_matches_the_tensor_map(tmp_path):
    from jaxrl_reason.models.hf import _Checkpoint, load_hf_config, tensor_map

    cfg = hf_import_memory.synthetic_config(quick=True)
    info = hf_import_memory.write_checkpoint(cfg, str(tmp_path), max_shard_bytes=10**6)
    assert info["n_files"] > 1 and info["n_tensors"] == len(tensor_map(cfg))
    assert info["checkpoint_bytes"] == 4 * cfg.num_params
    assert info["largest_tensor"] == "model.embed_tokens.weight"
    assert info["largest_tensor_bytes"] == 4 * cfg.vocab_size * cfg.d_model
    assert load_hf_config(str(tmp_path)).replace(scan_layers=False) == cfg.replace(
        scan_layers=False)
    ckpt = _Checkpoint(str(tmp_path))  # also checks the index against the files
    assert set(ckpt.info) == {e.name for e in tensor_map(cfg)}
    name = "model.layers.0.mlp.down_proj.weight"
    index = [e.name for e in tensor_map(cfg)].index(name)
    import safetensors.numpy
    got = safetensors.numpy.load_file(ckpt.where(name))[name]
    want = hf_import_memory.tensor_value(0, index, name, ckpt.info[name][1])
    assert (got == want).all() and 0.01 < got.std() < 0.03


def test_quick_json(tmp_path):
    out = tmp_path / "hf_import_memory.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("summary: import of ")
    assert "| scan_layers=False |" in proc.stdout and "| scan_layers=True |" in proc.stdout
    result = json.loads(out.read_text())
    ckpt = result["checkpoint"]
    assert result["quick"] is True and len(result["loadavg"]) == 3
    assert 0 < ckpt["largest_tensor_bytes"] < ckpt["checkpoint_bytes"] < 50 * 2**20
    assert ckpt["n_files"] > 1 and ckpt["file_bytes"] > ckpt["checkpoint_bytes"]
    assert set(result["runs"]) == {"scan_layers=False", "scan_layers=True"}
    for name, run in result["runs"].items():
        assert run["scan_layers"] == (name == "scan_layers=True")
        assert run["values_match"] is True
        assert run["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1, "context": 1}
        assert run["params_count"] * 4 == run["params_logical_bytes"] == ckpt[
            "checkpoint_bytes"]
        # Sharded 8 ways except replicated norms: at least the checkpoint, well under 8x.
        assert ckpt["checkpoint_bytes"] <= run["params_device_bytes"] < 2 * ckpt[
            "checkpoint_bytes"]
        assert run["rss_before_bytes"] > 0 and run["rss_peak_bytes"] >= run["rss_before_bytes"]
        assert run["rss_growth_bytes"] == run["rss_peak_bytes"] - run["rss_before_bytes"]
        assert run["overhead_bytes"] == run["rss_growth_bytes"] - run["params_device_bytes"]
        assert math.isfinite(run["overhead_over_largest"])
        assert run["overhead_over_largest"] == run["overhead_bytes"] / ckpt[
            "largest_tensor_bytes"]
        assert run["live_array_bytes"] >= run["params_device_bytes"]
        assert run["import_s"] > 0
