"""Load test: streamed requests up a concurrency ladder, with ``sglang.bench_serving``'s metrics.

Modules: ``spec`` (what to run), ``workload`` (the requests: random, dataset, shared prefix),
``client`` (one streamed request), ``streams`` (a level's streams,
in this process or over worker processes), ``metrics`` (per-level
results), ``ladder`` (closed-loop or open-loop levels, early end, abort, prune).
"""

from search.loadtest.ladder import NO_PROGRESS, LadderResult, arun_ladder, check_reachable, run_ladder
from search.loadtest.metrics import LevelResult
from search.loadtest.spec import LadderSpec, parse_concurrency, parse_duration, parse_goodput, parse_rates

__all__ = [
    "NO_PROGRESS",
    "LadderResult",
    "LadderSpec",
    "LevelResult",
    "arun_ladder",
    "check_reachable",
    "parse_concurrency",
    "parse_duration",
    "parse_goodput",
    "parse_rates",
    "run_ladder",
]
