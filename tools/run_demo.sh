#!/usr/bin/env bash
# README's main job: set up the CPU environment if needed, then run the CPU demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
exec .venv/bin/python tools/demo_cpu.py "$@" 2> >(grep -v -E "Ignore import error|UserWarning|warnings.warn|Loading safetensors|^$" >&2)
