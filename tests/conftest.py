"""Shared pytest configuration (keep minimal; fixtures live in their own modules)."""

pytest_plugins = ["tests.slurm_cluster"]
