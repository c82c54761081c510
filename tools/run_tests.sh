#!/usr/bin/env bash
# README's test command: set up the CPU environment if needed, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
