#!/usr/bin/env bash
# A fresh machine to a ranked demo study in one command: install, check the space, run a short
# study on the SGLang emulator (no GPU), show the ranking, export the winner and write the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
trials=${DEMO_TRIALS:-10}
# The space is real SGLang's; --emulate plays it on the emulator, here at 1/100 of real startup time.
export SEARCH_EMULATOR_TIME_SCALE=${SEARCH_EMULATOR_TIME_SCALE:-0.01}
search space check spaces/demo.yaml
search study run spaces/demo.yaml --study demo --n-trials "$trials" --storage sqlite:///demo.db --emulate
search study show demo --storage sqlite:///demo.db
search study export demo --storage sqlite:///demo.db --format shell -o profiles/demo-best.sh
search study report demo --storage sqlite:///demo.db -o demo-report.html
echo "best launch profile: profiles/demo-best.sh   report: demo-report.html"
