#!/usr/bin/env bash
# README's test command: set up the CPU environment if needed, then run the suite in three modes:
#   (a) stock sglang 0.5.9 + runtime patches (the whole suite);
#   (b) sglang 0.5.9 with the fork-path diffs applied (a patched copy shadows site-packages)
#       and runtime patching off: the behavioural patch tests again (docs/fork.md);
#   (c) the newest sglang release the matrix knows (tools/matrix_releases.json), in its own venv
#       under .matrix/: the behavioural suite and the plugin server (tools/matrix.py --ci; docs/compat.md).  Its venv is
#       built in the background while (a) runs (pip waits on the network and the disk, the
#       tests on the CPU), and (c) runs beside (b); `eagle3-patches selftest` is left out there: the suite asserts on the
#       same checks (the run_check fixture) and the full matrix runs the command in every release.
#       EAGLE3_SKIP_NEWEST=1 leaves it out (a quick local run).
# Extra arguments go to the mode (a) pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
PY=.venv/bin/python

newest_setup=""
if [ "${EAGLE3_SKIP_NEWEST:-0}" != "1" ]; then
    mkdir -p .matrix
    $PY tools/matrix.py --setup-only --releases newest-known >.matrix/ci-setup.log 2>&1 &
    newest_setup=$!
    trap '[ -z "$newest_setup" ] || kill "$newest_setup" 2>/dev/null || true' EXIT
fi

echo "== mode (a): stock sglang + runtime patches"
$PY -m pytest -q -p no:cacheprovider "$@"

# (c) runs beside (b): each keeps about one core busy (a pytest process and one sglang child at a time)
newest_run=""
if [ "${EAGLE3_SKIP_NEWEST:-0}" != "1" ]; then
    if ! wait "$newest_setup"; then
        newest_setup=""
        cat .matrix/ci-setup.log >&2
        echo "mode (c): the venv of the newest known release could not be set up (above)" >&2
        exit 1
    fi
    newest_setup=""
    $PY tools/matrix.py --ci --releases newest-known --no-selftest >.matrix/ci-newest.log 2>&1 &
    newest_run=$!
    trap '[ -z "$newest_run" ] || kill "$newest_run" 2>/dev/null || true' EXIT
fi

echo "== mode (b): sglang with the fork-path diffs applied, runtime patching off"
rm -rf .fork-tree
$PY tools/make_fork_tree.py .fork-tree >/dev/null
PYTHONPATH="$PWD/.fork-tree" $PY -m pytest -q -p no:cacheprovider tests/patches tests/fork

if [ -n "$newest_run" ]; then
    echo "== mode (c): the newest known sglang release in its own venv (ran beside (b))"
    rc=0
    wait "$newest_run" || rc=$?
    newest_run=""
    cat .matrix/ci-setup.log .matrix/ci-newest.log
    exit "$rc"
fi
