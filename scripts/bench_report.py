"""How long `search study report` takes, and how big the page is, for studies of overnight size.

A synthetic study over spaces/demo.yaml is written with Optuna directly, trial by trial with the
user attributes of docs/architecture.md (phases, levels, GPU power, crashes at a phase with their
line, prunes, SLO breaches, re-measurement), so the report sees what a night of trials leaves.

    python scripts/bench_report.py --trials 40 200
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import optuna

from search import report
from search.space import Space, load_space
from search.storage import StudyAttr
from search.strategy import Strategy

SPACE = Path(__file__).resolve().parent.parent / "spaces" / "demo.yaml"
STARTUP = (("starting", 25), ("loading", 249), ("kv_cache", 6), ("autotune", 95), ("cuda_graph", 70), ("warmup", 5))


def synthetic(storage: str, name: str, space: Space, n: int, seed: int = 0) -> optuna.Study:
    """A finished study of ``n`` trials: crashes (triton, high memory fraction), prunes, completions."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study.set_user_attr(StudyAttr.SPACE, space.model_dump(mode="json"))
    strategy, rng, clock = Strategy(space, "random", seed=seed), random.Random(seed), time.time() - 3600 * 8
    study.enqueue_trial(dict(space.baseline or {}), user_attrs={"strategy": "baseline"})
    for _ in range(n):
        trial = study.ask()
        config = space.suggest(trial)
        crash = "cuda_graph" if config.get("--moe-runner-backend") == "triton" else \
            "kv_cache" if config.get("--mem-fraction-static", 0) > 0.92 else None
        phases, start = {}, clock
        for phase, seconds in STARTUP:
            phases[phase] = {"start": clock, "duration": seconds * rng.uniform(0.9, 1.1)}
            clock += phases[phase]["duration"]
            if phase == crash:
                break
        trial.set_user_attr("phases", phases)
        if crash:
            trial.set_user_attr("gpu_seconds", clock - start)
            strategy.tell(study, trial, "crashed", failure={"kind": "oom", "phase": crash, "message": "",
                                                           "line": "torch.OutOfMemoryError: CUDA out of memory."})
            continue
        levels, gpu, scale = [], [], rng.uniform(0.8, 2.4)
        pruned = rng.random() < 0.25
        for step, c in enumerate(space.load_test.concurrency):
            tok_s = 900 * scale * (1 + 0.2 * step)
            levels.append({"max_concurrency": c, "output_throughput": tok_s, "p99_ttft_ms": 300 * (step + 1) ** 2 / scale,
                           "p99_itl_ms": 40 * (step + 1) * rng.uniform(0.6, 1.4), "errors": {}})
            gpu.append({"concurrency": c, "power_w": 2400 + 300 * step, "power_limit_w": 4800, "utilization_pct": 80.0})
            trial.report(tok_s, step)
            clock += 120
            if pruned:
                break
        for key, value in (("levels", levels), ("gpu", gpu), ("gpu_seconds", clock - start),
                           ("peak_output_throughput", levels[-1]["output_throughput"]),
                           ("peak_concurrency", levels[-1]["max_concurrency"])):
            trial.set_user_attr(key, value)
        if pruned:
            strategy.tell(study, trial, "pruned")
        else:
            strategy.tell(study, trial, "completed", objective=levels[-1]["output_throughput"])
    top = sorted((t for t in study.trials if t.value is not None), key=lambda t: -t.value)[:3]
    study.set_user_attr(StudyAttr.REMEASURED, {str(t.number): [t.value * 0.98, t.value * 1.01] for t in top})
    return study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[40, 200])
    args = parser.parse_args()
    space = load_space(SPACE)
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{tmp}/bench.db"
        studies = {n: synthetic(storage, f"bench-{n}", space, n) for n in args.trials}
        print(f"{'trials':>7} {'1st write s':>12} {'2nd write s':>12} {'page MB':>8}")
        for n, study in studies.items():  # the 1st write in the process pays the imports, as the CLI does
            took = []
            for _ in range(2):
                began = time.perf_counter()
                out = report.write(study, Path(tmp) / f"{n}.html", storage)
                took.append(time.perf_counter() - began)
            print(f"{n:>7} {took[0]:>12.2f} {took[1]:>12.2f} {out.stat().st_size / 1e6:>8.2f}")


if __name__ == "__main__":
    main()
