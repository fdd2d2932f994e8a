"""Pallas kernels, each next to its jnp reference (installed as ``jaxrl_reason.kernels``).

- ``group_advantage``: group-relative advantages and per-group reward statistics
  (reference: ``jaxrl_reason.rl.advantages``);
- ``policy_loss``: the fused clipped policy-gradient loss, its metrics and its gradient
  (reference: ``jaxrl_reason.rl.losses.policy_loss``);
- ``logprobs``: token log-probs and entropies from hidden states and the unembedding;
- ``dispatch``: ``resolve_backend`` and drop-in ``group_advantages`` / ``group_stats`` /
  ``policy_loss`` that take ``backend="auto" | "pallas" | "reference"`` and fall back to the
  reference for options a kernel does not implement.

Submodules are imported explicitly (``from jaxrl_reason.kernels import dispatch``), so
importing the package does not import Pallas.
"""
