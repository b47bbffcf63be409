"""Trials per hour on 1, 2 and 4 emulated GPU hosts of a local Ray cluster (issue 8: >= 1.8x at 2),
and on one emulated 8-GPU host for a tp-2 space, one trial at a time against side by side (issue 23).

    python scripts/bench_parallel.py [--hosts 1 2 4] [--trials 12] [--time-scale 0.01]
    python scripts/bench_parallel.py --slots [--trials 16] [--tp 2] [--host-gpus 8]
    python scripts/bench_parallel.py --hosts 1 --node-gpus 8 --tp 2   # Ray nodes sharing their GPUs out

``--slots``: the same space at ``--tp-size 2`` on one emulated 8-GPU host of this machine, first
through `search.runner.InProcessRunner` (one trial at a time, as a host without a ``gpus`` list
runs), then through `search.slot_runner.SlotRunner` with the host's 8 GPUs shared out (four tp-2
trials at once); both through the real driver (`StudyRun`: ask/tell with constant liar, levels to
the pruner, artifacts), each trial a full emulated start on its own GPUs and port.

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

from search.hosts import local_host
from search.parallel import RayRunner, emulated_cluster
from search.runner import InProcessRunner, Runner
from search.slot_runner import SlotRunner
from search.space import Space, load_space
from search.study import StudyRun

HERE = Path(__file__).resolve().parent / "parallel"


def bench_space(time_scale: float, *, tp: int = 1, host_gpus: int = 1, extra: dict[str, str] | None = None) -> Space:
    """The benchmark's space at ``tp`` on an emulated host of ``host_gpus`` GPUs."""
    space = load_space(HERE / "space.yaml")
    env = {"SEARCH_EMULATOR_TIME_SCALE": str(time_scale), "SEARCH_EMULATOR_LANDSCAPE": str(HERE / "landscape.py"),
           "SEARCH_EMULATOR_GPUS": str(host_gpus), **(extra or {})}
    return space.model_copy(update={"launch": space.launch.model_copy(update={"env": env, "tp": tp})})


def study(space: Space, runner: Runner, name: str, trials: int, root: Path) -> tuple[float, float, float]:
    """(wall s, trials per hour, median s per trial) of one study of ``trials`` measured trials on ``runner``."""
    try:
        run = StudyRun(space=space, name=name, storage=f"sqlite:///{root / 'studies.db'}", seed=0,
                       n_trials=trials, remeasure=0, trials_dir=root / "trials", runner=runner)
        began = time.monotonic()
        finished = run.run()
        wall = time.monotonic() - began
    finally:
        runner.close()
    done = [t for t in finished.trials if t.state == TrialState.COMPLETE]
    per_trial = statistics.median((t.datetime_complete - t.datetime_start).total_seconds() for t in done)
    return wall, len(done) / wall * 3600, per_trial


def one(hosts: int, trials: int, time_scale: float, root: Path, node_gpus: int | None = None,
        tp: int = 1) -> tuple[float, float, float]:
    """One study on ``hosts`` emulated hosts of a fresh local Ray cluster (cluster start not timed); with
    ``node_gpus`` each host shares that many GPUs out (``search_gpu``) to trials at ``tp``."""
    cluster, _ = emulated_cluster(root / f"nodes-{hosts}", hosts, gpus=node_gpus)
    space = bench_space(time_scale, tp=tp, host_gpus=node_gpus or 1)
    try:
        return study(space, RayRunner(cluster.address, emulate=True), f"bench-{hosts}", trials, root)
    finally:
        cluster.shutdown()


def slots(trials: int, time_scale: float, tp: int, host_gpus: int, root: Path) -> None:
    """One 8-GPU emulated host, a tp-``tp`` space: one trial at a time, then side by side on its GPUs."""
    space = bench_space(time_scale, tp=tp, host_gpus=host_gpus, extra={"SEARCH_EMULATOR_STATE_DIR": str(root / "gpus")})
    print("| runner | trials | wall s | s per trial (median) | trials/hour | speedup |")
    print("|---|---|---|---|---|---|")
    base = None
    for label, runner in (("one at a time", InProcessRunner([local_host(emulate=True)])),
                          (f"side by side ({host_gpus // tp} x tp {tp})",
                           SlotRunner([local_host(emulate=True, gpus=list(range(host_gpus)))]))):
        wall, rate, per_trial = study(space, runner, f"slots-{len(label)}", trials, root)
        base = base or rate
        print(f"| {label} | {trials} | {wall:.1f} | {per_trial:.1f} | {rate:,.0f} | {rate / base:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--time-scale", type=float, default=0.01)
    parser.add_argument("--slots", action="store_true", help="one 8-GPU host: one at a time vs side by side")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--host-gpus", type=int, default=8)
    parser.add_argument("--node-gpus", type=int, default=None,
                        help="Ray hosts share this many GPUs out (search_gpu) to trials at --tp")
    args = parser.parse_args()
    if args.slots:
        with tempfile.TemporaryDirectory(prefix="bench-slots-") as tmp:
            slots(args.trials, args.time_scale, args.tp, args.host_gpus, Path(tmp))
        return
    os.environ["RAY_AUTH_MODE"] = "disabled"  # a local cluster for this process only
    print("| hosts | trials | wall s | s per trial (median) | trials/hour | speedup |")
    print("|---|---|---|---|---|---|")
    base = None
    with tempfile.TemporaryDirectory(prefix="bench-parallel-") as tmp:
        for hosts in args.hosts:
            wall, rate, per_trial = one(hosts, args.trials, args.time_scale, Path(tmp), args.node_gpus,
                                        args.tp if args.node_gpus else 1)
            base = base or rate
            print(f"| {hosts} | {args.trials} | {wall:.1f} | {per_trial:.1f} | {rate:,.0f} | {rate / base:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
