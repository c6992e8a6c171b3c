#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install, then pytest. The SLURM tests bring the
# local 2-node cluster up themselves (tests/fixtures/slurm_cluster.py) and take it down after.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
# Static checks first (seconds): formatting, lint, and the one-way import layers (pyproject.toml).
.venv/bin/ruff format --check --quiet .
.venv/bin/ruff check --quiet .
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
# The documentation site (mkdocs.yml): a broken link, page or generated reference fails here.
site_dir=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site_dir" && rm -rf "$site_dir"
# Two pytest-xdist workers on CI's two cores: a run's wall time is half waiting (Ray and engine start-ups,
# SLURM polls), which a second worker overlaps; more workers than cores made the CPU-bound runs (learning,
# smokes) time out. tests/conftest.py keeps the SLURM tests on one worker (one cluster per machine), the
# learning runs on one, and a module's tests together when they share a module-scoped fixture.
# SLIME_TEST_WORKERS=0 runs everything in this one process.
# `extended` marks the further cases of a heavy e2e family (one representative case stays in CI);
# `bash ci/test.sh -m extended` runs them.
exec .venv/bin/python -m pytest -n "${SLIME_TEST_WORKERS:-2}" --dist loadgroup -m "not extended" "$@"
