#!/usr/bin/env bash
# README's main job: set up the CPU environment if needed, then run the CPU demo (the real
# sglang 0.5.9 server doing EAGLE-3 speculative decoding on a tiny Kimi-K2.5; docs/e2e.md).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
bash tools/setup_env.sh
echo "set-up: ${SECONDS} s"
status=0
.venv/bin/python tools/demo_cpu.py "$@" 2> >(grep -v -E "Ignore import error|UserWarning|warnings.warn|Loading safetensors|^$" >&2) || status=$?
echo "total, set-up included: ${SECONDS} s"
exit "$status"
