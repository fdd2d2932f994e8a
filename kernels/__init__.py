"""Pallas kernels, each next to its jnp reference (installed as ``jaxrl_reason.kernels``)."""
