"""A real demo study for the report: `search study run` on the emulator with a tiny space.

Landscape: the request cap (1 vs SGLang's automatic) decides throughput, ``triton`` crashes in
autotune with the FlashInfer JIT line, ``cutlass`` runs at 30% (below the target, so the ladder is
pruned after its first level), ``--chunked-prefill-size`` nudges throughput. The study's five
trials are the baseline and four `--start-from` commands, so whatever order the strategy's sweep
would take, every chart gets data: two wins (three completed trials give importances), a crash
and a prune.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import helpers

# cutlass runs at 30%, and a chunked prefill of 4096 wins 25%: a 5% win was pruned once on a box loaded
# enough to read its first level ~8% low (the reach rule then sees it end under the smaller win).
LANDSCAPE = helpers.toy_landscape(
    '(0.3 if flags["moe_runner_backend"] == "cutlass" else 1.0) * (1.25 if flags.get("chunked_prefill_size") == 4096 else 1.0)'
)
STUDY = "demo"
_LAUNCH = "python -m sglang.launch_server --model-path test/model --chunked-prefill-size"
# The smaller win runs before the bigger: the other way round, the pruner may rightly stop it (it
# would end 25% under the best), and the importances would lack their third completed trial.
KNOWN = (f"{_LAUNCH} 2048 --moe-runner-backend flashinfer_cutlass",  # a win (the automatic cap)
         f"{_LAUNCH} 4096 --moe-runner-backend flashinfer_cutlass",  # a bigger win
         f"{_LAUNCH} 4096 --moe-runner-backend triton",  # crashes in autotune
         f"{_LAUNCH} 2048 --moe-runner-backend cutlass --max-running-requests 1")  # pruned at the first level
CRASH_LINE = "returned non-zero exit status 1"


def write_space(root: Path, time_scale: str = "0.004") -> Path:
    """The demo space: the shared toy one plus a chunked-prefill size that wins a little."""
    return helpers.write_space(
        root, time_scale=time_scale, landscape=LANDSCAPE,
        params={
            "--max-running-requests": {"type": "categorical", "choices": [1, None]},
            "--moe-runner-backend": {"type": "categorical", "choices": ["flashinfer_cutlass", "triton", "cutlass"]},
            "--chunked-prefill-size": {"type": "categorical", "choices": [2048, 4096]},
        },
        baseline={"--max-running-requests": 1, "--moe-runner-backend": "flashinfer_cutlass",
                  "--chunked-prefill-size": 2048},
        load_test={"input_len": 32, "output_len": 64, "concurrency": [4, 16], "duration_s": 1.5, "warmup_s": 0.1},
        slos={"p99_ttft_ms": 5000, "p99_itl_ms": 1000},
    )


def search(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The real `search` CLI in a subprocess, run in ``root`` with the emulator state kept there."""
    env = {**os.environ, "SEARCH_EMULATOR_STATE_DIR": str(root / "state")}
    done = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=240)
    if check and done.returncode != 0:
        raise AssertionError(f"search {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished demo study in ``<root>/studies.db`` (5 measured trials, the top 3 re-measured once)."""
    root = tmp_path_factory.mktemp("report")
    known = [arg for command in KNOWN for arg in ("--start-from", command)]
    search(root, "study", "run", str(write_space(root)), "--study", STUDY, "--emulate", "--n-trials", "5",
           "--seed", "0", "--remeasure", "1", *known)
    return root
