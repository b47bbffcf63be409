"""The strategy's constants, in one frozen object the benchmark can vary and the tests can pass.

`search.strategy.Strategy`, its ladder pruner and `search.ranking.Ranking` read every number that
tunes them, and which sources of the plan (`search.plan`) run, from a :class:`Settings`; the product
runs on ``Settings()``. Ablating or retuning a rule
is a new ``Settings`` (``scripts/bench_search.py --settings KEY=VALUE``), never a patched module
constant, so two variants can run side by side in one process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from search.errors import BadInput

# The sources of the plan (`search.plan`) that ``Settings.plan_off`` can leave out, each alone; the
# screen is switched by ``Settings.screen`` (off, the sweep takes every parameter instead).
PLAN_SOURCES: tuple[str, ...] = ("crash_fix", "repairs", "edge", "revisit", "cap_read", "sweep", "fine_cap_read", "inactive",
                                 "combine", "unordered", "model")


@dataclass(frozen=True)
class Settings:
    """Every number the search is tuned by, and the plan's sources left out; the defaults are what
    `search study run` uses."""

    # -- the ladder pruner
    prune_ratio: float = 0.6  # a level under this fraction of the best completed trial's at that level is pruned
    prune_min_completed: int = 2  # completed trials needed at a level before the relative rules prune at it
    # -- the plan
    numeric_points: int = 3  # points per numeric parameter in the sweep and the grid sampler
    sweep_passes: int = 2  # pass 0: every choice and a coarse grid; later: neighbours at half the distance
    screen: bool = True  # screen each parameter once, sweep only those that mattered (False: sweep all, space order)
    noise_margin: float = 0.04  # a change moves the centre only if it wins by more (measurements vary ~2-3%)
    max_partners: int = 4  # repairs tried per move that crashed
    repair_steps: int = 2  # grid steps an advised parameter moves at most
    undo_repairs: bool = False  # repair a screen or sweep move whose failure's first fix is undoing it (False: the edge closes in)
    # a sweep skips values at or past an out-of-memory edge of their own, and (later passes) past a
    # value of the centre's line that lost beyond noise
    skip_past: bool = True
    repair_points: int = 5  # grid points a repair's step is taken on
    revisit_margin: float = 0.02  # a one-flag win by this much is tried again once the centre has moved
    close: float = 1 / 8  # a sweep skips a value within this fraction of the range of the centre's
    lost_margin: float = 0.2  # ... and one that lost to an earlier centre by more than this alone
    # the centre is an uncapped config (its ladder shows the whole curve) while the best of them is
    # within this fraction of the best config (1.0: whenever one works; far below, a binding cap is the point)
    uncapped_margin: float = 0.1
    read_close: float = 1 / 32  # a cap read off the ladder this close to a cap already run is not tried
    model_candidates: int = 256  # changes of the best configs the model's proposal is chosen among
    model_step: float = 0.1  # their numeric moves: a normal step of this fraction of the range
    model_tops: int = 3  # the best configs (by the model) the candidates change
    # every n-th candidate sets one categorical (a backend, a switch) to another choice instead
    # (0: numeric moves only; BENCHMARKS.md, fourteenth round)
    model_flip_every: int = 8
    model_past_oom: bool = True  # the model skips candidates asking more memory than an OOM crash, any cap
    sampler_past_oom: bool = True  # ... and the sampler's proposals that do are told crashed without running
    plan_off: tuple[str, ...] = ()  # sources of the plan left out (PLAN_SOURCES; ``--settings plan_off=revisit,model``)
    startup_trials: int = 5  # the TPE / GP samplers' random trials (the baseline and sweep seed them)
    # -- the crash and repeat memory
    max_skips: int = 30  # proposals told without running per ask before a repeat or known crash runs anyway
    # -- the ranking (search.ranking)
    rank_band: float = 0.15  # the model is fitted on the feasible trials within this fraction of the best
    band_min_points: int = 8  # ... once the band holds this many (else on every feasible trial)
    # the first of the ranking is measured within this fraction of the best; 6% left good configs out
    # behind one lucky measurement (BENCHMARKS.md, ninth round)
    rank_guard: float = 0.10
    # -- the load test
    rate_search_steps: int = 3  # max_rate_under_slo: levels that bisect past the first rate missing the SLOs

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "plan_off":
                unknown = [n for n in value if n not in PLAN_SOURCES] if isinstance(value, tuple) else [repr(value)]
                if unknown:
                    raise BadInput(f"setting plan_off: {', '.join(unknown)} is not a source of the plan "
                                   f"(one of {', '.join(PLAN_SOURCES)})")
            elif f.type == "bool":
                if not isinstance(value, bool):
                    raise BadInput(f"setting {f.name}: {value!r} is not true or false")
            elif f.type == "int":
                least = 0 if f.name in _MAY_BE_ZERO else 1
                if isinstance(value, bool) or not isinstance(value, int) or value < least:
                    raise BadInput(f"setting {f.name}: {value!r} is not a whole number of at least {least}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
                raise BadInput(f"setting {f.name}: {value!r} is not a fraction in (0, 1]")

    def varied(self, pairs: Iterable[str]) -> Settings:
        """These settings with ``KEY=VALUE`` pairs applied (the benchmark's ``--settings``)."""
        known = {f.name: f.type for f in dataclasses.fields(self)}
        changes: dict[str, object] = {}
        for pair in pairs:
            key, sep, text = pair.partition("=")
            if not sep or key not in known:
                raise BadInput(f"--settings {pair!r}: give KEY=VALUE with KEY one of {', '.join(known)}")
            try:
                changes[key] = (tuple(n for n in text.split(",") if n) if key == "plan_off"
                                else _boolean(text) if known[key] == "bool"
                                else int(text) if known[key] == "int" else float(text))
            except ValueError:
                raise BadInput(f"--settings {pair!r}: {text!r} is not a {known[key]}") from None
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


_MAY_BE_ZERO = ("max_skips", "rate_search_steps", "model_flip_every")  # 0 turns the rule off


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise ValueError(text)


DEFAULT = Settings()  # what the product runs on
