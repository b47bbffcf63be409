#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite: the README's test command and CI's.
# Most tests wait on emulated server startups (sleeping, not computing), so three workers share
# the two cores (9:27 against 12:46 on two, BENCHMARKS.md); the few that measure
# a rate against the model (marker `timing`) run alone afterwards so no neighbour skews them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
# The type checker and the linter first: a protocol that drifts from its callers fails here, in seconds.
python3 -m mypy
python3 -m ruff check search tests scripts
if [ $# -gt 0 ]; then
  exec python3 -m pytest -q "$@"
fi
python3 -m pytest -q -n 3 --dist loadfile -m "not timing" --durations=15
exec python3 -m pytest -q -m timing
