#!/usr/bin/env bash
# Installs `search` and, with `--test`, everything its test suite needs, on a fresh Debian
# machine with Python 3.11+. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" -m pip install -q --disable-pip-version-check -e '.[test]'
# An editable install leaves `search` uncompiled, and where PYTHONDONTWRITEBYTECODE is set (many
# containers) no run writes the bytecode either: each process then compiles what it imports, ~0.7 s of
# CPU for a CLI start on a 2-core box, at every emulated server, rank and CLI call. A changed
# file is still read from source (the bytecode records its source's mtime).
"$PY" -m compileall -q search

if [ "${1:-}" = "--test" ]; then
  # The real SGLang parser proves our flag manifests; importing it needs torch and triton
  # (CPU build, no GPU), then sglang itself without its GPU-only dependencies.
  if ! "$PY" -c 'import sglang.srt.server_args' 2>/dev/null; then
    "$PY" -m pip install -q --disable-pip-version-check torch==2.13.0 triton numpy pillow starlette pyzmq \
      tqdm ipython aiohttp msgspec orjson pybase64 psutil requests packaging
    "$PY" -m pip install -q --disable-pip-version-check --no-deps sglang==0.5.23
  fi
  # sglang's OpenAI protocol models (tests/fidelity/test_http.py re-serializes the emulator's
  # chunks with them) import the openai package.
  "$PY" -c 'import openai' 2>/dev/null || "$PY" -m pip install -q --disable-pip-version-check openai
  # The real wheels the fidelity tests (tests/fidelity) check every log text against, without
  # dependencies, unpacked once into the git-ignored .whl/src/<dist>-<version>/.
  for spec in sglang==0.5.8.post1 sglang==0.5.9 sglang==0.5.23 flashinfer-python==0.6.3 flashinfer-python==0.7.2; do
    name=${spec%%==*}; name=${name//-/_}; version=${spec##*==}
    dest=.whl/src/$name-$version
    [ -f "$dest/.unpacked" ] && continue
    wheel=$(ls .whl/$name-$version-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
      "$PY" -m pip download -q --disable-pip-version-check --no-deps "$spec" -d .whl
      wheel=$(ls .whl/$name-$version-*.whl | head -1)
    fi
    rm -rf "$dest" && mkdir -p "$dest"
    "$PY" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.endswith(".py")])' "$wheel" "$dest"
    touch "$dest/.unpacked"
  done
  # HEBO, a peer in the search benchmark (scripts/bench_peers.py): its metadata pins numpy<1.25
  # and pymoo 0.6.0, yet it runs on today's, so it goes in without its pins, then its needs.
  if ! "$PY" -c 'from hebo.optimizers.hebo import HEBO' 2>/dev/null; then
    "$PY" -m pip install -q --disable-pip-version-check --no-deps HEBO==0.3.6 disjoint-set
    "$PY" -m pip install -q --disable-pip-version-check pymoo gpytorch GPy catboost
  fi
  # A real OpenSSH server for the SSH host tests; PostgreSQL for the storage tests; Chromium for the report's screenshot test.
  need=()
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server openssh-client)
  command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
  command -v chromium >/dev/null || need+=(chromium)
  if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
fi
