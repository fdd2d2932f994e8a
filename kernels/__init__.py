"""Pallas kernels (installed as ``jaxrl_reason.kernels``): the leaf of the package graph.

Nothing here imports the ``rl`` package; ``rl`` imports the kernels. See ``README.md`` in this
folder for what each kernel computes, its declared support and its jnp reference.

- ``group_advantage`` / ``group_advantage_gpu``: group-relative advantages and per-group
  reward statistics (Mosaic TPU / Triton GPU);
- ``policy_loss`` / ``policy_loss_gpu``: the fused clipped policy-gradient loss, its metrics
  and its gradient;
- ``logprobs`` / ``logprobs_gpu``: token log-probs and entropies from hidden states and the
  unembedding, without materializing the logits;
- ``checks``: argument checks shared with the references; ``formulas``: per-token formulas
  shared with them; ``platform``: the platform the kernels are built for.

Which of kernel or reference runs is decided in ``rl/backends.py`` from each kernel module's
``SUPPORTS``. Submodules are imported explicitly (``from jaxrl_reason.kernels import
group_advantage``), so importing the package does not import Pallas.
"""
