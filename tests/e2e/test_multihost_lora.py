"""LoRA GRPO multi-host for real, on one machine: 2 processes x 4 CPU devices joined by
`jax.distributed` on localhost, against 1 process x 8 devices (launchers in
tests/cli_runs.py, shared with `test_multihost.py`).

`test_lora_on_two_processes_trains_like_one` (slow, ~6 min): `jaxrl-reason train` of
configs/arith_grpo_lora.py:smoke with an int8 base, LoRA dropout 0.1 and a KL to the
base-as-reference (cold-start SFT, 2 RL steps with adapter-only checkpoints), then `--resume`
to 4 RL steps, each way. The metrics match to the tolerance `test_multihost.py` uses for
float32 across the two layouts (rtol 1e-4, atol 1e-6; sampled tokens and rewards exactly),
and so does every array of the final RL checkpoints in norm (`_norm_close`), which hold only
the adapters and their optimizer state, written once (orbax's multi-host save, the manifest
by process 0), and resumable (the second launch resumes from step 2).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from cli_runs import REPO, assert_trained_alike, load_state, train_both_ways

LORA = os.path.join(REPO, "configs", "arith_grpo_lora.py")
# The evaluations `train` runs are cut to one seed of 4 problems: this test compares the
# training, and test_multihost.py compares multi-host evaluation in full.
LORA_FLAGS = ("--config.model.lora.base_quant=int8", "--config.model.lora.dropout=0.1",
              "--config.rl.beta=0.04", "--config.eval.num_problems=4", "--config.eval.seeds=(0,)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"multi": workdir, "single": workdir}: 2 RL steps, then resumed to 4, each way."""
    return train_both_ways(LORA, tmp_path_factory.mktemp("multihost_lora"), *LORA_FLAGS,
                           timeout=1200)


@pytest.mark.slow
def test_lora_on_two_processes_trains_like_one(runs):
    multi, _ = assert_trained_alike(runs)
    rl = [m for m in multi if m["phase"] == "rl"]
    assert rl[0]["kl"] == 0.0 and any(m["kl"] > 0 for m in rl[1:])  # base = reference


def _norm_close(a: np.ndarray, b: np.ndarray, where: str, rtol: float = 1e-4) -> None:
    """|a - b| <= rtol |b| in the 2-norm of the whole array. Not elementwise: the adapters
    start at B = 0 and every entry is a sum of Adam steps, lr * m / sqrt(v), which turns an
    entry whose gradient nearly cancels (its float32 sum depends on the layout's reduction
    order) into a relative difference far above the gradient's; seen: one entry in 1,536
    off by 2.9e-6 at 1.0e-3, while the array differs by 5.5e-5 of its norm."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    diff, norm = float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
    assert diff <= rtol * norm + 1e-12, f"{where}: |a - b| = {diff:.3g}, |b| = {norm:.3g}"


@pytest.mark.slow
def test_adapter_checkpoints_written_once_and_equal(runs):
    directory = runs["multi"] / "checkpoints" / "rl"
    assert sorted(os.listdir(directory)) == ["2", "4"]  # one directory per step, no leftovers
    a, b = (load_state(runs[w] / "checkpoints" / "rl" / "4") for w in ("multi", "single"))
    assert a.keys() == b.keys()
    arrays = [k for k in a if "'params'" in k or "'mu'" in k or "'nu'" in k]
    assert arrays and all("'lora_a'" in k or "'lora_b'" in k for k in arrays), arrays[:5]
    assert not any("kernel" in k or "embedding" in k for k in a)  # the base is not saved
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        if np.issubdtype(a[k].dtype, np.integer):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # step counts, RNG
        else:
            _norm_close(a[k], b[k], k)
    with open(directory / "4" / "jaxrl_manifest.json") as f:
        assert json.load(f)["files"]  # process 0 wrote the manifest after orbax finished
    from jaxrl_reason.checkpoints.checkpointer import Checkpointer
    with Checkpointer(str(directory)) as ckpt:  # names the SFT base it applies to
        base = ckpt.metadata()["lora_base"]
    assert base["kind"] == "checkpoint" and base["path"].endswith(os.path.join("checkpoints",
                                                                               "sft"))
