#!/usr/bin/env bash
# Installs `search` and, with `--test`, everything its test suite needs, on a fresh Debian
# machine with Python 3.11+. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" -m pip install -q --disable-pip-version-check -e '.[test]'

if [ "${1:-}" = "--test" ]; then
  # The real SGLang parser proves our flag manifests; importing it needs torch and triton
  # (CPU build, no GPU), then sglang itself without its GPU-only dependencies.
  if ! "$PY" -c 'import sglang.srt.server_args' 2>/dev/null; then
    "$PY" -m pip install -q --disable-pip-version-check torch==2.13.0 triton numpy pillow starlette pyzmq \
      tqdm ipython aiohttp msgspec orjson pybase64 psutil requests packaging
    "$PY" -m pip install -q --disable-pip-version-check --no-deps sglang==0.5.23
  fi
  # HEBO, a peer in the search benchmark (scripts/bench_peers.py): its metadata pins numpy<1.25
  # and pymoo 0.6.0, yet it runs on today's, so it goes in without its pins, then its needs.
  if ! "$PY" -c 'from hebo.optimizers.hebo import HEBO' 2>/dev/null; then
    "$PY" -m pip install -q --disable-pip-version-check --no-deps HEBO==0.3.6 disjoint-set
    "$PY" -m pip install -q --disable-pip-version-check pymoo gpytorch GPy catboost
  fi
  # A real OpenSSH server for the SSH host tests; Chromium for the report's screenshot test.
  need=()
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
  command -v chromium >/dev/null || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
