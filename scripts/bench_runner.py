"""The search benchmark's runner: the product's driver (`search.study.StudyRun`) with each trial
played from a landscape in this process instead of on a server.

`LandscapeRunner` implements `search.runner.Runner` as `InProcessRunner` does, one job at a time;
only what a server would have done comes from the landscape: how the config starts (a crash's
text goes through the real log classifier, as a server's log line would), each ladder level's
throughput with the landscape's measurement noise, and the GPU time it held. Everything else (the
strategy, the pruner reading each level, the sampler, storage, re-queued repeats) is the product's
own code path, so the benchmark measures what `search study run` does.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING, Any

from search.lifecycle import Failure
from search.loadtest import LevelResult
from search.runner import Hooks, Job, PlayedRunner
from search.storage import Outcome
from search.trial import TrialResult

if TYPE_CHECKING:
    from bench_search import Simulator


def level_result(concurrency: int, running: int, tok_s: float, seconds: float) -> LevelResult:
    """A ladder level at ``tok_s`` whose ``running`` streams decode together (ITL = running / rate)."""
    itl = 1000.0 * running / tok_s if tok_s > 0 else None
    tokens = int(tok_s * seconds)
    return LevelResult(concurrency, float(running), seconds, 0, 0, tokens, 0.0, 0.0, tok_s, tok_s,
                       None, None, None, None, itl, itl, itl, itl, itl, itl, itl, itl, None, None, None, None)


class LandscapeRunner(PlayedRunner):
    """Plays each job on ``sim`` (bench_search.Simulator), with the landscape's measurement noise.

    The noise is drawn from common random numbers: a config's n-th run in a study with seed ``seed``
    gets the same draws whatever ran before it. Two variants of the strategy compared on one
    landscape then differ by what they try, not by which noise each trial happened to draw (with one
    stream for the whole study, moving a single trial reshuffled the noise of every later one, and
    per-landscape results swung by 10-25 trials either way).
    """

    def __init__(self, sim: Simulator, noise: float, seed: int) -> None:
        super().__init__(self._play)
        self.sim, self.noise, self.seed = sim, noise, seed
        self._runs: Counter[str] = Counter()

    def _play(self, job: Job, hooks: Hooks) -> TrialResult:
        from bench_search import as_failure

        config: dict[str, Any] = dict(job.config)
        key = repr(sorted(config.items()))
        self._runs[key] += 1
        rng = random.Random(f"{self.seed}|{key}|{self._runs[key]}")  # str seeds hash stably (sha512)
        failed, spent = self.sim.startup(config)
        if failed is not None:
            seen = as_failure(failed)
            failure = Failure(seen["kind"], seen["phase"], seen["line"], False, seen["message"], tuple(seen["advice"]))
            return TrialResult(Outcome.CRASHED, job.trial_dir, job.marker, failure=failure, gpu_seconds=spent)
        levels: list[LevelResult] = []
        met: list[LevelResult] = []
        for concurrency in self.sim.problem.concurrency:
            value, ok = self.sim.level(config, concurrency, self.noise, rng)
            spent += self.sim.problem.level_seconds
            levels.append(level_result(concurrency, self.sim.running(config, concurrency), value,
                                       self.sim.problem.level_seconds))
            if ok:
                met.append(levels[-1])
            if not hooks.level(levels[-1]) and len(levels) < len(self.sim.problem.concurrency):
                return TrialResult(Outcome.PRUNED, job.trial_dir, job.marker, levels=levels, slo_ok=bool(met),
                                   gpu_seconds=spent)
        peak = max(met, key=lambda lv: lv.output_throughput) if met else None
        return TrialResult(Outcome.COMPLETED, job.trial_dir, job.marker, levels=levels, slo_ok=bool(met),
                           answers_differ=self.sim.corrupt(config),
                           objective=peak.output_throughput if peak else None,
                           peak_concurrency=peak.max_concurrency if peak else None, gpu_seconds=spent)
