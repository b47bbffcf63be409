#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite: the README's test command and CI's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec python3 -m pytest -q "$@"
