"""notebooks/quickstart.ipynb runs end to end in a fresh kernel (so the walkthrough cannot rot).

The notebook is executed with nbclient in an ipykernel subprocess (its first cell sets the
8-fake-CPU-device flags itself, before importing jax), from notebooks/ as a user would.
nbclient, nbformat and ipykernel are in the `dev` extra: when they are missing the test
fails naming them rather than skipping, so CI cannot silently stop running the notebook.
"""

from __future__ import annotations

import importlib
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOK = os.path.join(REPO, "notebooks", "quickstart.ipynb")
STEPS = 5               # NUM_STEPS in the notebook
CELL_TIMEOUT_S = 600    # per cell; the whole notebook takes about a minute on a CPU
KERNEL = "python3"


def _require(*modules: str):
    """The imported modules, or a test failure naming what to install."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        pytest.fail(f"running {os.path.relpath(NOTEBOOK, REPO)} needs {', '.join(missing)}: "
                    "pip install -e '.[dev]' (or pip install nbclient nbformat ipykernel)",
                    pytrace=False)
    return [importlib.import_module(name) for name in modules]


def _read():
    (nbformat,) = _require("nbformat")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    return nb


def _text(cell) -> str:
    """The stream and text/plain outputs of a code cell, joined."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


def test_committed_notebook_has_no_outputs():
    nb = _read()
    assert nb.nbformat == 4
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "the notebook has no code cells"
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"clear the outputs of cells {dirty} before committing"
    # The device flags are set before anything imports jax.
    first = code[0].source
    assert "xla_force_host_platform_device_count=8" in first and "import jax" not in first


def test_quickstart_notebook_runs_end_to_end(tmp_path, monkeypatch):
    nbclient, jupyter_kernelspec, _ = _require("nbclient", "jupyter_client.kernelspec",
                                                "ipykernel")
    try:
        jupyter_kernelspec.KernelSpecManager().get_kernel_spec(KERNEL)
    except jupyter_kernelspec.NoSuchKernel:
        pytest.fail(f"no {KERNEL!r} Jupyter kernel: python -m ipykernel install --user",
                    pytrace=False)
    nb = _read()
    # The kernel inherits this environment: the notebook's tempfile.mkdtemp() workdir
    # (tokenizer, metrics, checkpoints, plot) lands under pytest's tmp_path.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    client = nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, startup_timeout=180, kernel_name=KERNEL,
        resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute()  # raises CellExecutionError (with the cell's traceback) on any error

    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.get("output_type") == "error"]
    assert not errors, errors
    assert all(c.execution_count is not None for c in code), "a code cell did not run"

    # The plot cell rendered an image, and the last cell reports the plotted series.
    assert any("image/png" in o.get("data", {}) for c in code for o in c.outputs), \
        "no cell displayed a PNG (the metrics plot)"
    last = _text(code[-1])
    assert re.search(rf"^steps: {STEPS}$", last, re.M), last
    for key in ("reward/mean", "completion/length_mean"):
        match = re.search(rf"^{re.escape(key)}: \[(.*)\]$", last, re.M)
        assert match, f"no {key} series in the last cell's output:\n{last}"
        values = [v.strip() for v in match.group(1).split(",")]
        assert len(values) == STEPS, (key, values)
        assert all(v != "nan" for v in values), (key, values)
    lengths = [float(v) for v in re.search(r"^completion/length_mean: \[(.*)\]$", last,
                                           re.M).group(1).split(",")]
    assert all(0 <= n <= 16 for n in lengths), lengths  # max_new_tokens=16 in the notebook
