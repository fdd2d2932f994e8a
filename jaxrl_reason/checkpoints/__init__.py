"""Checkpoints of a run: the orbax checkpointer, each step's manifest and checks,
the phase checkpoints of a pipeline, and the one-run-per-workdir lock."""
