"""Evaluation: sampling held-out problems on device (runner), pass@k / maj@k /
best-of-k estimators (pass_at_k), intervals over seeds (stats), and paired comparisons
of two checkpoints (compare)."""
