"""Run configs: loading `configs/*.py` files, and validating a config before anything
compiles."""
