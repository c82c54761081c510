#!/usr/bin/env bash
# Create (or reuse) the CPU test environment in .venv: idempotent, no GPU needed.
# sglang 0.5.9 goes in with --no-deps: its own pins (torch 2.9.1 CUDA, sgl-kernel,
# flashinfer) cannot run on a CPU machine; the CPU profile stands in for them.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EAGLE3_VENV:-.venv}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.9}
stamp="$VENV/.eagle3-env-$(cat requirements-test.txt pyproject.toml | sha256sum | cut -c1-16)-sglang-$SGLANG_VERSION"
if [ -f "$stamp" ]; then exit 0; fi
# mooncake's transfer engine (requirements-test.txt) loads libibverbs even where it talks TCP: Debian's packages
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq libibverbs1 librdmacm1 libnuma1 ibverbs-providers >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libibverbs1 librdmacm1 libnuma1 ibverbs-providers >/dev/null; } \
      || echo "setup_env: could not install libibverbs1 (tests/e2e/test_pd_pair.py will skip)" >&2
  else
    echo "setup_env: libibverbs1 is missing; install libibverbs1 librdmacm1 libnuma1 ibverbs-providers (tests/e2e/test_pd_pair.py will skip)" >&2
  fi
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# pip's notes about this machine's unused local index locations are noise here
exec 2> >(grep -v "^WARNING: Location 'file://" >&2)
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$VENV/bin/python" -m pip install -q -r requirements-test.txt
"$VENV/bin/python" -m pip install -q --no-deps "sglang==$SGLANG_VERSION"
# setuptools warns about every editable install; keep its output unless the install fails
"$VENV/bin/python" -m pip install -q --no-deps -e . 2>"$VENV/editable-install.log" \
  || { cat "$VENV/editable-install.log" >&2; exit 1; }
rm -f "$VENV"/.eagle3-env-*
touch "$stamp"
