#!/usr/bin/env bash
# README's test command: set up the CPU environment if needed, run the linters (tools/lint.sh: ruff, mypy,
# import-linter's layers), then run the suite in three modes:
#   (a) stock sglang 0.5.9 + runtime patches (the whole suite);
#   (b) sglang 0.5.9 with the fork-path diffs applied (a patched copy shadows site-packages)
#       and runtime patching off: the behavioural patch tests again (docs/fork.md);
#   (c) the newest sglang release the matrix knows (tools/matrix_releases.json), in its own venv
#       under .matrix/: the behavioural suite but tests/unit, the plugin and MLA-draft servers (tools/matrix.py --ci;
#       docs/compat.md);
#       `eagle3-patches selftest` is left out there: the suite asserts on the same checks (the run_check
#       fixture) and the full matrix runs the command in every release.
# Two streams share the two cores, each running one process at a time on one thread (OMP_NUM_THREADS=1: torch's
# default of a thread per core in every process oversubscribes two cores with two streams):
#   stream 1: mode (a) without the real servers and without tests/distributed, then mode (c) (its venv is built
#             beside the streams from the start: network and disk);
#   stream 2: mode (a)'s real servers (tests/e2e) and tests/distributed (two ranks a test), then mode (b).
# Stream 2's output is printed when it ends.  EAGLE3_SKIP_NEWEST=1 leaves (c) out (a quick local run).
# Where the time went is recorded under .matrix/costs (EAGLE3_TEST_COSTS, one directory a mode) and printed at the
# end (tools/test_costs.py; `python tools/test_costs.py --docs` writes the tables into docs/development.md).
# Extra arguments: one mode (a) pytest run with them, in the foreground, and nothing else.
set -euo pipefail
set -m  # every background job in its own process group: the EXIT trap stops a stream with its children
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
SETUP_SECONDS=$SECONDS
PY=.venv/bin/python
PYTEST=("$PY" -m pytest -q -p no:cacheprovider)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

if [ $# -gt 0 ]; then
    echo "== mode (a): stock sglang + runtime patches ($*)"
    exec "${PYTEST[@]}" "$@"
fi

mkdir -p .matrix
rm -rf .matrix/costs
mkdir -p .matrix/costs
COSTS="$PWD/.matrix/costs"
printf '{"part": "set-up (tools/setup_env.sh)", "seconds": %d}\n' "$SETUP_SECONDS" >"$COSTS/modes.jsonl"
# timed PART COMMAND...: run it with its costs recorded under .matrix/costs/<mode> and its wall time noted
timed() {
    local part=$1 mode=$2 start=$SECONDS rc=0
    shift 2
    EAGLE3_TEST_COSTS="$COSTS/$mode" "$@" || rc=$?
    printf '{"part": "%s", "seconds": %d}\n' "$part" $((SECONDS - start)) >>"$COSTS/modes.jsonl"
    return "$rc"
}
STREAM2_LOG=.matrix/ci-stream2.log
SETUP_LOG=.matrix/ci-setup.log
setup_pid=""
if [ "${EAGLE3_SKIP_NEWEST:-0}" != "1" ]; then
    $PY tools/matrix.py --setup-only --releases newest-known >"$SETUP_LOG" 2>&1 &
    setup_pid=$!
fi
stream2() {
    local rc=0
    echo "== mode (a), the real servers: tests/e2e"
    timed "stream 2: (a) tests/e2e" a-e2e "${PYTEST[@]}" tests/e2e || rc=$?
    echo "== mode (a), tensor parallel 2: tests/distributed"
    timed "stream 2: (a) tests/distributed" a-distributed "${PYTEST[@]}" tests/distributed || rc=$?
    echo "== mode (b): sglang with the fork-path diffs applied, runtime patching off"
    rm -rf .fork-tree
    $PY tools/make_fork_tree.py .fork-tree >/dev/null
    PYTHONPATH="$PWD/.fork-tree" timed "stream 2: (b) the fork-path diffs" b "${PYTEST[@]}" tests/patches tests/fork || rc=$?
    return "$rc"
}
stream2 >"$STREAM2_LOG" 2>&1 &
stream2_pid=$!
trap 'for p in "$stream2_pid" "$setup_pid"; do [ -z "$p" ] || kill -- "-$p" 2>/dev/null || true; done' EXIT

rc_lint=0 rc_a=0 rc_c=0 rc_2=0
echo "== the linters (tools/lint.sh)"
timed "stream 1: the linters" lint bash tools/lint.sh || rc_lint=$?
echo "== mode (a): stock sglang + runtime patches (tests/e2e, tests/distributed and mode (b) run beside it: their output follows)"
timed "stream 1: (a) without tests/e2e, tests/distributed" a "${PYTEST[@]}" --ignore=tests/e2e --ignore=tests/distributed || rc_a=$?

if [ -n "$setup_pid" ]; then
    echo "== mode (c): the newest known sglang release in its own venv"
    if ! wait "$setup_pid"; then
        cat "$SETUP_LOG"
        echo "mode (c): the venv of the newest known release could not be set up (above)"
        rc_c=1
    else
        cat "$SETUP_LOG"
        timed "stream 1: (c) the newest known release" c $PY tools/matrix.py --ci --releases newest-known --no-selftest || rc_c=$?
    fi
    setup_pid=""
fi

wait "$stream2_pid" || rc_2=$?
stream2_pid=""
cat "$STREAM2_LOG"
printf '{"part": "the test command", "seconds": %d}\n' "$SECONDS" >>"$COSTS/modes.jsonl"
echo "== where the time went (tools/test_costs.py)"
$PY tools/test_costs.py || true
for rc in "$rc_lint" "$rc_a" "$rc_c" "$rc_2"; do
    [ "$rc" = 0 ] || exit "$rc"
done
