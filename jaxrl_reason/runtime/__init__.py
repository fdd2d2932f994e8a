"""What a run stands on: building it from its config (build), the mesh and sharding,
multi-host and CPU devices, run directories, guards, metrics logging, progress, the
training state and optimizer, and ahead-of-time sizing for TPU slices (plan)."""
