#!/usr/bin/env bash
# The linters, as CI runs them (tools/run_tests.sh runs this first) and as .pre-commit-config.yaml runs them on
# commit: ruff (lint and format), mypy (the library) and import-linter (the layers of docs/architecture.md).
# Configuration: pyproject.toml. Sets up .venv first if needed (tools/setup_env.sh), like the other tools.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
BIN=.venv/bin
rc=0
echo "== ruff check" && "$BIN/ruff" check --no-cache . || rc=1
echo "== ruff format --check" && "$BIN/ruff" format --check --no-cache . || rc=1
echo "== mypy" && "$BIN/mypy" || rc=1
echo "== lint-imports" && "$BIN/lint-imports" --no-cache --no-logo || rc=1
exit "$rc"
