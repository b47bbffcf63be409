#!/usr/bin/env python3
"""Sample efficiency of the study's search strategy against plain Optuna samplers.

    python scripts/bench_search.py --space spaces/demo.yaml --landscape L.py --trials 60 --seeds 5 --json

Each trial goes through `search.strategy.Strategy` exactly as `search study run` drives it
(sampler, warm start, sweep, pruning, constraints); only the server and HTTP are replaced by
direct calls to the landscape with relative measurement noise. Simulated GPU time per trial:
the landscape's phase durations up to the crash (a hang costs the phase's timeout), then one
level duration per ladder level actually run. At a level, min(concurrency, effective
max_running_requests) requests decode at once; p99 ITL is 1000 * running / tok/s.

The optimum is found by enumerating the space on a fine grid. Reported per sampler, medians
over seeds: trials (that started a server) and GPU hours until the study's best config (chosen by
measured value, judged by its true value) reaches 95% / 99% of the optimum, and the best found
within N trials.

``--settings KEY=VALUE`` (repeatable) runs ours on `search.settings.Settings` with those fields
changed, e.g. ``--settings noise_margin=0.06 --settings screen=false``, or sources of the plan left
out, ``--settings plan_off=revisit,model`` (`search.settings.PLAN_SOURCES`): a variant of the strategy
measured without editing it (the peers are unguided and read none of it).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import math
import multiprocessing
import random
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from bench_peers import PEERS, make_peer  # noqa: E402
from bench_runner import LandscapeRunner  # noqa: E402

from search.distributions import SpaceLike, discover  # noqa: E402
from search.errors import BadInput  # noqa: E402
from search.lifecycle import Failure  # noqa: E402
from search.logwatch import LogClassifier  # noqa: E402
from search.moves import grid_values  # noqa: E402
from search.settings import DEFAULT, Settings  # noqa: E402
from search.storage import Attr, StudyAttr, TrialView  # noqa: E402
from search.strategy import Strategy  # noqa: E402
from search.study import Listener, StudyRun  # noqa: E402

PHASES = ("starting", "loading", "kv_cache", "autotune", "cuda_graph", "warmup")
DEFAULT_PHASE_SECONDS = {"starting": 20.0, "loading": 300.0, "kv_cache": 20.0, "warmup": 10.0}
DEFAULT_TIMEOUT = 900.0
SAMPLER_KINDS = ("ours", "tpe", "gp", "hebo", "random", "grid")
# The optimum is enumerated on the space's own steps; a log range (or a range without a step)
# at FINE_POINTS points at least, or all its integers where there are no more than ALL_INTS.
FINE_POINTS = 25
ALL_INTS = 256
# Enumerated optima by (space file, landscape file, grid) content: repeated runs skip the enumeration.
OPTIMUM_CACHE = Path(__file__).resolve().parent.parent / "build" / "bench_search_optimum"


@dataclass
class Problem:
    """What a study needs of a space, with the config -> landscape flags conversion."""

    space: SpaceLike
    concurrency: list[int]
    level_seconds: float
    to_flags: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, str]]]
    itl_slo_ms: float | None = None
    timeouts: dict[str, float] = field(default_factory=dict)


def load_problem(path: Path) -> Problem:
    """A space file through the real modules: `load_space`, `render`, the version's manifest."""
    from search import manifests
    from search.profile import render
    from search.space import load_space

    space = load_space(path)
    manifest = manifests.load(space.sglang_version)

    def to_flags(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        profile = render(space, config)
        return manifest.parse(profile.args).values, dict(profile.env)

    load = space.load_test
    # A level of `requests` requests lasts about that many outputs at the level's concurrency;
    # the benchmark charges levels by time, so use the space's duration or the schema default.
    level_seconds = float(load.duration_s or 120.0) + float(load.warmup_s)
    return Problem(space=space, concurrency=list(load.concurrency), level_seconds=level_seconds,
                   to_flags=to_flags, itl_slo_ms=space.slos.p99_itl_ms, timeouts=dict(space.timeouts))


def load_landscape(path: Path) -> ModuleType:
    """A landscape file (issue 3's interface), imported by path as the emulator does."""
    spec = importlib.util.spec_from_file_location(f"landscape_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot import landscape {path}: give a .py file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Simulator:
    """Runs a config on a landscape: startup outcome, per-level throughput, GPU seconds."""

    def __init__(self, problem: Problem, landscape: ModuleType,
                 to_flags: Callable[[dict[str, Any]], tuple[dict[str, Any], dict[str, str]]] | None = None) -> None:
        self.problem = problem
        self.land = landscape
        self._to_flags = to_flags or problem.to_flags
        # Every config's flags are kept (a study revisits configs), except on a given fast path,
        # which enumerates far too many to keep: there only the last one is.
        self._keep_all = to_flags is None
        self._flags: dict[tuple, tuple[dict[str, Any], dict[str, str]]] = {}

    def flags(self, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        key = tuple(sorted(config.items(), key=lambda kv: kv[0]))
        if key not in self._flags:
            if not self._keep_all:
                self._flags.clear()
            self._flags[key] = self._to_flags(config)
        return self._flags[key]

    def phases(self, flags: dict[str, Any], env: dict[str, str]) -> dict[str, float]:
        fn = getattr(self.land, "phase_seconds", None)
        return dict(fn(flags, env)) if fn else dict(DEFAULT_PHASE_SECONDS)

    def startup(self, config: dict[str, Any]) -> tuple[dict | None, float]:
        """(failure or None, GPU seconds spent starting up)."""
        flags, env = self.flags(config)
        phases = self.phases(flags, env)
        failure = self.land.startup(flags, env)
        if failure is None:
            return None, sum(phases.values())
        cut = PHASES.index(failure["phase"]) if failure["phase"] in PHASES else len(PHASES) - 1
        spent = sum(phases.get(p, 0.0) for p in PHASES[:cut])
        if failure.get("hang"):
            spent += self.problem.timeouts.get(failure["phase"], DEFAULT_TIMEOUT)
        else:
            spent += phases.get(failure["phase"], 0.0)
        return failure, spent

    def corrupt(self, config: dict[str, Any]) -> bool:
        fn = getattr(self.land, "corrupt", None)
        return bool(fn(*self.flags(config))) if fn else False

    def running(self, config: dict[str, Any], concurrency: int) -> int:
        """Requests decoding at once at a level: the streams, up to the running cap."""
        flags, env = self.flags(config)
        cap = flags.get("max_running_requests")
        if cap is None and hasattr(self.land, "max_running_requests"):
            cap = self.land.max_running_requests(flags, env)
        return max(1, min(concurrency, cap or concurrency))

    def level(self, config: dict[str, Any], concurrency: int, noise: float, rng: random.Random) -> tuple[float, bool]:
        """(output tok/s, SLO met) at one ladder level."""
        flags, env = self.flags(config)
        running = self.running(config, concurrency)
        value = self.land.throughput(flags, env, running) * (1.0 + rng.gauss(0.0, noise) if noise else 1.0)
        slo = self.problem.itl_slo_ms
        return value, slo is None or value <= 0 or 1000.0 * running / value <= slo

    def true_value(self, config: dict[str, Any]) -> float | None:
        """Noise-free objective; None when the config crashes, hangs, corrupts or meets no SLO."""
        if self.startup(config)[0] is not None or self.corrupt(config):
            return None
        rng = random.Random(0)
        ok = [v for v, met in (self.level(config, c, 0.0, rng) for c in self.problem.concurrency) if met]
        return max(ok) if ok else None


def as_failure(landscape_failure: Mapping[str, Any]) -> dict[str, Any]:
    """A landscape's failure as the trial records it: the error's lines through the log watcher,
    which keeps the deciding line and the advice lines after it (nothing else reaches the study)."""
    text = str(landscape_failure.get("error", ""))
    if landscape_failure.get("hang"):
        return {"kind": "stall", "phase": landscape_failure.get("phase"), "line": "", "message": "", "advice": []}
    classifier = LogClassifier()
    classifier.phase = landscape_failure.get("phase")  # the log had reached it (its lines are not simulated)
    for line in text.splitlines():
        classifier.feed(line)
    failure = Failure.from_event(classifier.failure, classifier.advice) if classifier.failure else None
    line = failure.line if failure else text
    return {"kind": failure.kind if failure else "crash", "phase": landscape_failure.get("phase"), "line": line,
            "message": line, "advice": list(failure.advice) if failure else []}


_ABSENT = object()  # a conditional parameter left out of a config


class FlagComposer:
    """Flags of a grid config from per-value deltas against the baseline: the enumeration's fast path.

    Rendering and parsing a config costs milliseconds, and a fine grid has 10^5 configs; but each
    parameter usually maps to its own flags, so a config's flags are the baseline's with every
    parameter's change applied. `verified` checks that on a sample against the real conversion.
    """

    def __init__(self, sim: Simulator, grid: Mapping[str, list[Any]]) -> None:
        self.sim = sim
        self.base = dict(sim.problem.space.baseline)
        self.flags0, self.env0 = sim.flags(self.base)
        self.deltas: dict[tuple[str, Any], tuple[dict[str, Any], dict[str, str | None]]] = {}
        for name, values in grid.items():
            for value in [*values, _ABSENT]:
                config = {k: v for k, v in {**self.base, name: value}.items() if v is not _ABSENT}
                flags, env = sim.flags(config)
                self.deltas[(name, _key(value))] = (
                    {k: v for k, v in flags.items() if self.flags0.get(k, _ABSENT) != v},
                    {k: env.get(k) for k in {*env, *self.env0} if env.get(k) != self.env0.get(k)})

    def flags(self, config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        flags, env = dict(self.flags0), dict(self.env0)
        for name in {*config, *self.base}:
            value = config.get(name, _ABSENT)
            if value is _ABSENT and name not in self.base or self.base.get(name, _ABSENT) == value:
                continue
            dflags, denv = self.deltas[(name, _key(value))]
            flags.update(dflags)
            for k, v in denv.items():
                if v is None:
                    env.pop(k, None)
                else:
                    env[k] = v
        return flags, env

    def verified(self, configs: list[dict[str, Any]]) -> bool:
        return all(self.flags(c) == self.sim.problem.to_flags(c) for c in configs)


def _key(value: Any) -> Any:
    return "<absent>" if value is _ABSENT else (type(value).__name__, value)


def fine_values(dist: Any) -> list[Any]:
    """One parameter's values for the optimum: every choice, step or integer, or FINE_POINTS on a log range."""
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)
    if isinstance(dist, optuna.distributions.IntDistribution) and (dist.high - dist.low) // dist.step < ALL_INTS:
        return list(range(dist.low, dist.high + 1, dist.step))
    if isinstance(dist, optuna.distributions.FloatDistribution) and dist.step and not dist.log:
        return grid_values(dist, int(round((dist.high - dist.low) / dist.step)) + 1)
    return grid_values(dist, FINE_POINTS * 4 if not dist.log else FINE_POINTS)


def fine_grid(space: SpaceLike) -> dict[str, list[Any]]:
    return {name: fine_values(dist) for name, dist in discover(space).items()}


def separable(sim: Simulator, grid: Mapping[str, list[Any]], names: tuple[str, ...],
              rng: random.Random, samples: int = 40) -> None:
    """Check a landscape's claim that each of ``names`` scales throughput by its own factor and
    never changes how a config starts; raise if a sampled config shows otherwise.

    Such a parameter's best value is the same whatever the others are, so the optimum is the
    best of the rest (that parameter at the baseline's value) with that parameter at its best:
    exact, and orders of magnitude fewer configs to run (NCCL's 32 channel counts multiply
    everything else).
    """
    space = sim.problem.space
    for name in names:
        base = space.baseline[name]
        for _ in range(samples):
            config = space.suggest(optuna.trial.FixedTrial({n: rng.choice(v) for n, v in grid.items()}))
            ref = {**config, name: base}
            value = rng.choice(grid[name])
            moved = {**config, name: value}
            if (sim.startup(moved)[0] is None) != (sim.startup(ref)[0] is None):
                raise SystemExit(f"error: {name} changes whether {ref} starts; it is not separable")
            if sim.startup(ref)[0] is not None:
                continue
            factors = {sim.level(moved, c, 0.0, rng)[0] / max(sim.level(ref, c, 0.0, rng)[0], 1e-12)
                       for c in sim.problem.concurrency}
            if max(factors) - min(factors) > 1e-9 * max(factors):
                raise SystemExit(f"error: {name}={value} scales {ref} by {sorted(factors)} across levels; not separable")


_SIM: Simulator | None = None  # the simulator forked workers use
_GRID: dict[str, list[Any]] = {}  # the grid forked workers enumerate


def _optimum_part(part: tuple[int, int]) -> tuple[float, dict[str, Any]]:
    """The best feasible config among every `of`-th point of `_GRID` starting at `index`."""
    index, of = part
    assert _SIM is not None
    space, grid = _SIM.problem.space, _GRID
    combos = (dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values()))
    sample = [space.suggest(optuna.trial.FixedTrial(c)) for c in itertools.islice(combos, 0, None, 997)][:60]
    composer = FlagComposer(_SIM, grid)
    fast = Simulator(_SIM.problem, _SIM.land, composer.flags) if composer.verified(sample) else _SIM
    best: tuple[float, dict[str, Any]] = (0.0, {})
    for i, combo in enumerate(itertools.product(*grid.values())):
        if i % of != index:
            continue
        config = space.suggest(optuna.trial.FixedTrial(dict(zip(grid, combo, strict=True))))
        value = fast.true_value(config)
        if value is not None and value > best[0]:
            best = (value, config)
    return best


def _best_on(sim: Simulator, grid: dict[str, list[Any]], jobs: int) -> tuple[float, dict[str, Any]]:
    global _SIM, _GRID
    _SIM, _GRID = sim, grid
    parts = [(i, jobs) for i in range(jobs)]
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            found = pool.map(_optimum_part, parts)
    else:
        found = [_optimum_part(parts[0])]
    return max(found, key=lambda vc: vc[0])


def cached_optimum(sim: Simulator, key_text: bytes, jobs: int = 1) -> tuple[float, dict[str, Any]]:
    """`optimum`, remembered under build/ keyed by the space and landscape (their files' bytes)."""
    key = hashlib.sha256(key_text + f"\0fine{FINE_POINTS}/{ALL_INTS}".encode()).hexdigest()[:24]
    path = OPTIMUM_CACHE / f"{key}.json"
    if path.exists():
        found = json.loads(path.read_text())
        return float(found["value"]), dict(found["config"])
    value, config = optimum(sim, jobs)
    OPTIMUM_CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"value": value, "config": config}))
    return value, config


def optimum(sim: Simulator, jobs: int = 1) -> tuple[float, dict[str, Any]]:
    """The landscape's best feasible config, every point of the space's fine grid run.

    Parameters the landscape declares in ``SEPARABLE`` (checked by `separable`) are enumerated
    apart: the rest with them at the baseline's values, then each of them on the best of the rest.
    """
    grid = fine_grid(sim.problem.space)
    apart = tuple(getattr(sim.land, "SEPARABLE", ()))
    separable(sim, grid, apart, random.Random(0))
    baseline = sim.problem.space.baseline
    value, config = _best_on(sim, {n: ([baseline[n]] if n in apart else v) for n, v in grid.items()}, jobs)
    for name in apart:
        fixed = {n: [config[n]] if n in config else [v[0]] for n, v in grid.items()}
        value, config = _best_on(sim, {**fixed, name: grid[name]}, jobs)
    return value, config


def make_strategy(kind: str, space: SpaceLike, seed: int, settings: Settings = DEFAULT) -> Strategy:
    """"ours" is the product's strategy on ``settings``; the others are peers (bench_peers.py), unguided."""
    if kind == "ours":
        return Strategy(space, "tpe", seed=seed, settings=settings)
    if kind == "grid":
        return Strategy(space, kind, seed=seed, guided=False)
    if kind in PEERS:
        return make_peer(kind, space, seed)
    raise SystemExit(f"error: unknown sampler {kind!r}: one of {', '.join(SAMPLER_KINDS)}")


def run_study(sim: Simulator, kind: str, seed: int, n_trials: int, noise: float,
              settings: Settings = DEFAULT, remeasure: int = StudyRun.remeasure) -> list[dict[str, Any]]:
    """One study of n_trials server starts, driven by the product's `StudyRun` on a `LandscapeRunner`.

    Per trial, as it ends: the true value of the study's winner so far (by the product's own
    ranking, `StudyRun.best`), the best true value among the feasible configs run so far (what a
    perfect ranking would name: the gap is what the ranking costs) and the GPU hours spent. With
    ``remeasure`` (the product's end: the top configs run that many more times each, ranked by
    their mean), the last point also holds the winner's true value after it and the GPU hours
    it took.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    curve: list[dict[str, Any]] = []
    gpu, ran = [0.0], [0.0]

    def named() -> float:
        """The true value of the config the product's ranking names the winner now (0: none)."""
        best = run.best()
        return (sim.true_value(dict(best.params)) or 0.0) if best is not None else 0.0

    def trial_done(trial: optuna.trial.FrozenTrial) -> None:
        gpu[0] += float(trial.user_attrs.get(Attr.GPU_SECONDS, 0.0))  # what the driver recorded for it
        if TrialView(trial).feasible:
            ran[0] = max(ran[0], sim.true_value(dict(trial.params)) or 0.0)
        curve.append({"true": named(), "ran": ran[0], "gpu_hours": gpu[0] / 3600.0})

    with tempfile.TemporaryDirectory() as tmp:
        space = sim.problem.space
        searcher = make_strategy(kind, space, seed, settings)
        run = StudyRun(space=space, name=f"bench-{kind}-{seed}-{uuid.uuid4().hex[:8]}",
                       storage="sqlite:///:memory:", seed=seed, n_trials=n_trials, remeasure=remeasure,
                       trials_dir=Path(tmp) / "trials", listener=Listener(trial_done=trial_done),
                       runner=LandscapeRunner(sim, noise, seed), searcher=searcher)
        try:
            run.run()
        except RuntimeError as exc:  # a grid sampler that ran out of points ends the study early
            if "exhausted" not in str(exc).lower() and "grid" not in str(exc).lower():
                raise
        if remeasure and curve and run.study is not None:
            curve[-1]["remeasured"] = named()
            spent = float(run.study.user_attrs.get(StudyAttr.REMEASURE_GPU_SECONDS, 0.0))
            curve[-1]["remeasure_gpu_hours"] = spent / 3600.0
    return curve


def _median(values: list[float | None]) -> float | None:
    """Median where None (never reached) counts as worse than any number; None if the median is."""
    ranked = sorted(values, key=lambda v: float("inf") if v is None else v)
    mid = ranked[(len(ranked) - 1) // 2: len(ranked) // 2 + 1]
    if any(v is None for v in mid):
        return None
    return float(statistics.mean(mid))  # type: ignore[arg-type]


def summarize(curves: list[list[dict[str, Any]]], best: float) -> dict[str, Any]:
    """Medians over seeds of trials / GPU hours to 95% and 99% and the best fraction within N;
    ``ran_to_*``: trials until a config that good had run, named the winner or not."""
    out: dict[str, Any] = {}
    for pct in (95, 99):
        trials, hours, ran = [], [], []
        for curve in curves:
            hit = next((i for i, p in enumerate(curve) if p["true"] >= best * pct / 100.0), None)
            trials.append(None if hit is None else hit + 1)
            hours.append(None if hit is None else curve[hit]["gpu_hours"])
            ran.append(next((i + 1 for i, p in enumerate(curve) if p.get("ran", 0.0) >= best * pct / 100.0), None))
        out[f"trials_to_{pct}"] = _median(trials)
        out[f"gpu_hours_to_{pct}"] = _median(hours)
        out[f"ran_to_{pct}"] = _median(ran)
    finals = [curve[-1]["true"] / best if curve else 0.0 for curve in curves]
    out["best_fraction"] = round(statistics.median(finals), 4)
    out["gpu_hours_total"] = _median([curve[-1]["gpu_hours"] if curve else 0.0 for curve in curves])
    if curves and all(curve and "remeasured" in curve[-1] for curve in curves):
        out["best_fraction_remeasured"] = round(statistics.median(c[-1]["remeasured"] / best for c in curves), 4)
        out["remeasure_gpu_hours"] = _median([c[-1]["remeasure_gpu_hours"] for c in curves])
    return out


def _run_task(task: tuple[str, int, int, float, Settings, int]) -> list[dict[str, Any]]:
    kind, seed, trials, noise, settings, remeasure = task
    assert _SIM is not None
    return run_study(_SIM, kind, seed, trials, noise, settings, remeasure)


def bench(problem: Problem, landscape: Any, *, trials: int, seeds: int, noise: float | None = None,
          samplers: tuple[str, ...] = SAMPLER_KINDS, jobs: int = 1, cache_key: bytes | None = None,
          settings: Settings = DEFAULT, remeasure: int = StudyRun.remeasure) -> dict[str, Any]:
    """The whole benchmark for one space and landscape, as a JSON-ready dict.

    ``noise`` defaults to the landscape's own (a generated one draws it) or 2.5%. With
    ``cache_key`` (bytes naming the space and landscape) the optimum is cached under build/.
    """
    global _SIM
    noise = noise if noise is not None else float(getattr(landscape, "noise", 0.025))
    sim = Simulator(problem, landscape)
    best, best_config = cached_optimum(sim, cache_key, jobs) if cache_key else optimum(sim, jobs)
    _SIM = sim
    if best <= 0:
        raise SystemExit("error: no config of the space runs on this landscape: check the landscape")
    tasks = [(kind, seed, trials, noise, settings, remeasure) for kind in samplers for seed in range(seeds)]
    if jobs > 1:  # forked workers inherit the simulator
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            curves = pool.map(_run_task, tasks)
    else:
        curves = [_run_task(task) for task in tasks]
    results = {kind: summarize([c for (k, *_), c in zip(tasks, curves, strict=True) if k == kind], best) for kind in samplers}
    varied = {f: v for f, v in vars(settings).items() if v != getattr(DEFAULT, f)}
    return {"landscape": getattr(landscape, "__file__", "?"), "trials": trials, "seeds": seeds, "noise": noise,
            "remeasure": remeasure, "settings": varied,
            "optimum": {"value": round(best, 1), "config": best_config},
            "samplers": results, **against_peers(results)}


def _never(x: float | None) -> float:
    return math.inf if x is None else x


def against_peers(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Ours against the best peer of this landscape: its GPU-hour ratio to 95%, and whether a
    peer reached 99% in fewer trials (a median that never reached counts as never)."""
    ours = results.get("ours")
    peers = {k: r for k, r in results.items() if k != "ours"}
    if not ours or not peers:
        return {}
    h95 = min(_never(r["gpu_hours_to_95"]) for r in peers.values())
    t99 = min(_never(r["trials_to_99"]) for r in peers.values())
    mine = _never(ours["gpu_hours_to_95"])
    return {"ours_gpu_hours_to_95_vs_best_peer": None if math.isinf(mine) or math.isinf(h95) else round(mine / h95, 3),
            "ours_reached_95_where_no_peer_did": not math.isinf(mine) and math.isinf(h95),
            "ours_behind_best_peer_at_99": _never(ours["trials_to_99"]) > t99}


def across(results: list[dict[str, Any]]) -> dict[str, Any]:
    """What the issue's goals read, per sampler: medians over landscapes of each landscape's
    median over seeds (a median that never reached counts as never), and how many landscapes
    reached 95% and 99%; then ours against the best peer, where ours and a peer both ran."""
    kinds = list(dict.fromkeys(k for r in results for k in r["samplers"]))
    summary: dict[str, Any] = {"landscapes": len(results)}
    for kind in kinds:
        rows = [r["samplers"][kind] for r in results if kind in r["samplers"]]
        summary[kind] = {"landscapes": len(rows),
                         "reached_95": sum(o["trials_to_95"] is not None for o in rows),
                         "reached_99": sum(o["trials_to_99"] is not None for o in rows),
                         "trials_to_95": _median([o["trials_to_95"] for o in rows]),
                         "trials_to_99": _median([o["trials_to_99"] for o in rows]),
                         "best_fraction": _median([o["best_fraction"] for o in rows])}
        if all("best_fraction_remeasured" in o for o in rows):  # runs with --remeasure 0 lack it
            summary[kind]["best_fraction_remeasured"] = _median([o["best_fraction_remeasured"] for o in rows])
        if all("ran_to_95" in o for o in rows):  # runs before it was recorded lack it
            summary[kind].update({f"ran_to_{pct}": _median([o[f"ran_to_{pct}"] for o in rows]) for pct in (95, 99)})
    compared = [r for r in results if "ours_behind_best_peer_at_99" in r]
    if compared:
        ratios = [r["ours_gpu_hours_to_95_vs_best_peer"] for r in compared if r.get("ours_gpu_hours_to_95_vs_best_peer")]
        summary["against_peers"] = {
            "landscapes": len(compared),
            "ours_gpu_hours_to_95_vs_best_peer": _median(ratios) if ratios else None,
            "ours_reached_95_where_no_peer_did": sum(bool(r["ours_reached_95_where_no_peer_did"]) for r in compared),
            "behind_best_peer_at_99": sum(bool(r["ours_behind_best_peer_at_99"]) for r in compared)}
    return summary


def merged(paths: list[Path]) -> list[dict[str, Any]]:
    """The landscapes of several ``--json`` runs, each with every run's samplers side by side.

    A study is a function of its landscape, sampler, seed and trial count (the noise is drawn
    from the seed), so a slow peer (GPSampler) can run apart and still be compared trial for
    trial; runs of other trial or seed counts are refused rather than mixed.
    """
    by_land: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            raise SystemExit(f"error: --merge {path}: {exc}; give the output of a --json run") from None
        for r in lines:
            if "samplers" not in r:
                continue  # an "across" line
            have = by_land.setdefault(r["landscape"], {**r, "samplers": {}})
            if (have["trials"], have["seeds"]) != (r["trials"], r["seeds"]):
                raise SystemExit(f"error: --merge {path}: {r['landscape']} ran {r['trials']} trials x {r['seeds']} "
                                 f"seeds, another file {have['trials']} x {have['seeds']}; merge runs of one shape")
            have["samplers"].update(r["samplers"])
    return [{**r, **against_peers(r["samplers"])} for r in by_land.values()]


def parse_seeds(text: str) -> list[int]:
    """``0-49`` or ``3,7,9`` -> the landscape seeds."""
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            return list(range(lo, hi + 1))
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"error: --generated {text!r}: give a range such as 0-49 or a list such as 3,7,9") from None


def _table(result: dict[str, Any], seeds: int) -> None:
    print(f"{result['landscape']}: optimum {result['optimum']['value']} tok/s; medians over {seeds} seeds")
    print(f"{'sampler':8} {'t95':>6} {'t99':>6} {'h95':>7} {'h99':>7} {'best@N':>7} {'after re-measure':>17}")
    for kind, r in result["samplers"].items():
        cells = [r["trials_to_95"], r["trials_to_99"], r["gpu_hours_to_95"], r["gpu_hours_to_99"]]
        text = ["-" if c is None else f"{c:.1f}" for c in cells]
        after = r.get("best_fraction_remeasured")
        print(f"{kind:8} {text[0]:>6} {text[1]:>6} {text[2]:>7} {text[3]:>7} {r['best_fraction']:>7.3f} "
              f"{'-' if after is None else f'{after:.3f}':>17}")
    print(f"ours GPU hours to 95% / best peer's: {result.get('ours_gpu_hours_to_95_vs_best_peer')}; "
          f"behind the best peer at 99%: {result.get('ours_behind_best_peer_at_99')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", type=Path)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--merge", type=Path, nargs="+", metavar="JSONL",
                       help="summarize earlier --json --generated runs together (a slow peer run apart)")
    where.add_argument("--landscape", type=Path, help="a landscape file")
    where.add_argument("--generated", help="seeds of scripts/landscapes/generator.py's landscapes, e.g. 0-49")
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--noise", type=float, default=None,
                        help="relative std of a measurement (default: the landscape's own, else 0.025)")
    parser.add_argument("--samplers", default=",".join(SAMPLER_KINDS))
    parser.add_argument("--jobs", type=int, default=1, help="studies run in parallel processes")
    parser.add_argument("--remeasure", type=int, default=StudyRun.remeasure,
                        help="runs of each top config after the trials, as `search study run --remeasure` "
                             "(its default); the winner after them is reported apart (0: none)")
    parser.add_argument("--settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a field of search.settings.Settings for ours (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON (one object a landscape, a line each with --generated)")
    args = parser.parse_args(argv)
    try:
        settings = DEFAULT.varied(args.settings)
    except BadInput as exc:
        parser.exit(2, f"error: {exc}\n")
    if args.remeasure < 0:
        parser.exit(2, f"error: --remeasure {args.remeasure}: give 0 (none) or more runs of each top config\n")
    if args.merge:
        print(json.dumps({"across": across(merged(args.merge))}))
        return 0
    if args.space is None:
        parser.exit(2, "error: --space is needed to run studies (only --merge goes without)\n")
    problem = load_problem(args.space)
    kw = {"trials": args.trials, "seeds": args.seeds, "noise": args.noise,
          "samplers": tuple(args.samplers.split(",")), "jobs": args.jobs, "settings": settings,
          "remeasure": args.remeasure}
    if args.landscape:
        landscapes = [(load_landscape(args.landscape), args.landscape.read_bytes())]
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent / "landscapes"))
        import generator

        source = (Path(generator.__file__).read_bytes())
        landscapes = [(generator.make(seed), source + f"\0{seed}".encode()) for seed in parse_seeds(args.generated)]
    results = []
    for landscape, key in landscapes:
        result = bench(problem, landscape, cache_key=args.space.read_bytes() + b"\0" + key, **kw)
        results.append(result)
        if args.json:
            print(json.dumps(result, indent=None if args.generated else 2, default=str), flush=True)
        else:
            _table(result, args.seeds)
    if args.generated:
        print(json.dumps({"across": across(results)}) if args.json else f"across: {across(results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
