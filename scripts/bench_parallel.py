"""Trials per hour on 1, 2 and 4 emulated GPU hosts of a local Ray cluster (issue 8: >= 1.8x at 2).

    python scripts/bench_parallel.py [--hosts 1 2 4] [--trials 12] [--time-scale 0.01]

For each host count: a fresh cluster (`search.parallel.emulated_cluster`: one node per host, each
with its own emulator state and port), then one study of `--trials` measured trials through the
real driver (`StudyRun` + `RayRunner`: ask/tell, per-trial actors, levels relayed, artifacts
shipped back). A trial is a full emulated server start (10 s of phases at the default scale,
mostly sleep, so 2 cores carry 4 hosts) plus a one-level load test. Cluster start is excluded;
the clock runs from the study's first ask to its last record. Prints one row per host count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from optuna.trial import TrialState

from search.parallel import RayRunner, emulated_cluster
from search.space import load_space
from search.study import StudyRun

HERE = Path(__file__).resolve().parent / "parallel"


def one(hosts: int, trials: int, time_scale: float, root: Path) -> tuple[float, float, float]:
    """(wall s, trials per hour, median s per trial) of one study on ``hosts`` emulated hosts."""
    space = load_space(HERE / "space.yaml")
    env = {"SEARCH_EMULATOR_TIME_SCALE": str(time_scale), "SEARCH_EMULATOR_LANDSCAPE": str(HERE / "landscape.py"),
           "SEARCH_EMULATOR_GPUS": "1"}
    space = space.model_copy(update={"launch": space.launch.model_copy(update={"env": env})})
    cluster, _ = emulated_cluster(root / f"nodes-{hosts}", hosts)
    runner = RayRunner(cluster.address, emulate=True)
    try:
        run = StudyRun(space=space, name=f"bench-{hosts}", storage=f"sqlite:///{root / 'studies.db'}", seed=0,
                       n_trials=trials, remeasure=0, trials_dir=root / "trials", runner=runner)
        began = time.monotonic()
        study = run.run()
        wall = time.monotonic() - began
    finally:
        runner.close()
        cluster.shutdown()
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    per_trial = statistics.median((t.datetime_complete - t.datetime_start).total_seconds() for t in done)
    return wall, len(done) / wall * 3600, per_trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--time-scale", type=float, default=0.01)
    args = parser.parse_args()
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a local cluster for this process only
    print("| hosts | trials | wall s | s per trial (median) | trials/hour | speedup |")
    print("|---|---|---|---|---|---|")
    base = None
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        for hosts in args.hosts:
            wall, rate, per_trial = one(hosts, args.trials, args.time_scale, Path(tmp))
            base = base or rate
            print(f"| {hosts} | {args.trials} | {wall:.1f} | {per_trial:.1f} | {rate:,.0f} | {rate / base:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
