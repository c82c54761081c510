#!/usr/bin/env bash
# README's test command: set up the CPU environment if needed, then run the suite in three modes:
#   (a) stock sglang 0.5.9 + runtime patches (the whole suite);
#   (b) sglang 0.5.9 with the fork-path diffs applied (a patched copy shadows site-packages)
#       and runtime patching off: the behavioural patch tests again (docs/fork.md);
#   (c) the newest sglang release the matrix knows (tools/matrix_releases.json), in its own venv
#       under .matrix/: the behavioural patch tests (tools/matrix.py --ci; docs/compat.md).
#       EAGLE3_SKIP_NEWEST=1 leaves it out (a quick local run).
# Extra arguments go to the mode (a) pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
PY=.venv/bin/python

echo "== mode (a): stock sglang + runtime patches"
$PY -m pytest -q -p no:cacheprovider "$@"

echo "== mode (b): sglang with the fork-path diffs applied, runtime patching off"
rm -rf .fork-tree
$PY tools/make_fork_tree.py .fork-tree >/dev/null
PYTHONPATH="$PWD/.fork-tree" $PY -m pytest -q -p no:cacheprovider tests/patches tests/fork

if [ "${EAGLE3_SKIP_NEWEST:-0}" != "1" ]; then
    echo "== mode (c): the newest known sglang release in its own venv"
    $PY tools/matrix.py --ci --releases newest-known
fi
