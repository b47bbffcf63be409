"""How a study searches: the sampler, the plan around it, pruning and what each outcome tells Optuna.

`search study run` and `scripts/bench_search.py` both drive trials through one `Strategy`, so the
sample efficiency measured by the benchmark is the product's. It composes parts that can each be
varied and ablated alone:

- the plan (`search.plan`): the baseline and known configs first (`Strategy.start`), then the
  screen, the one-flag sweep, repairs of crashed moves, cap reads off the ladder and the model's
  proposals, each a source of its own; every ``ask`` enqueues the plan's next batch, if any;
- the sampler (TPE by default: multivariate, grouped, constant liar) for every trial the plan
  leaves to it;
- the ladder rules (`search.pruner.LadderPruner`, an Optuna pruner): a trial below the space's
  per-level target, well below what completed trials reached at the same level, or unable to catch
  the best even if it grew over the rest of the ladder as fast as any completed trial did, is
  pruned after that level;
- the crash and repeat memory (`search.memory.Memory`, a filter around the sampler's ask): a choice
  that crashed alone in the sweep from a working config is not started again unless it was out of
  memory (a threshold that moves with other flags); an exact repeat of a measured, running or
  waiting config is not started again (noise is handled by the end-of-study re-measurement
  instead), unless the sampler proposed nothing else ``max_skips`` times in a row;
- the ranking (`search.ranking`, the one every view uses): a Gaussian-process estimate that pools
  the measurements of similar configs, not the single luckiest measurement.

What each outcome tells Optuna: a crash is PRUNED with constraint ``crashed = 1`` (TPE ignores FAIL,
so it would keep proposing it); an infrastructure fault is FAIL and the same parameters are
enqueued again. Every number is a field of `search.settings.Settings`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from search import surrogate
from search.distributions import SpaceLike, discover
from search.errors import BadInput
from search.memory import Memory
from search.moves import grid_values
from search.plan import History, next_batch
from search.pruner import LadderPruner
from search.ranking import Ranking, same_config
from search.settings import DEFAULT, Settings
from search.storage import Attr, Outcome, Plan, TrialView, set_constraints, views

SAMPLERS: tuple[str, ...] = ("tpe", "gp", "random", "grid")

# The plan's notes a retried trial keeps, so the plan reads the retry as the move it repeats.
_PLAN_NOTES = (Attr.PLAN, Attr.SWEEP_PARAM, Attr.SWEEP_PASS, Attr.SWEEP_FROM_WORKING, Attr.PARTNER_OF,
               Attr.CENTRE_SCORE, Attr.SWEEP_FROM)


def grid_space(space: SpaceLike, points: int) -> dict[str, list[Any]]:
    """The search space as a grid (for `GridSampler` and for enumerating a landscape's optimum)."""
    return {name: grid_values(dist, points) for name, dist in discover(space).items()}


def make_sampler(name: str, space: SpaceLike, seed: int | None = None,
                 settings: Settings = DEFAULT) -> optuna.samplers.BaseSampler:
    """The Optuna sampler for `--sampler NAME`.

    "tpe" is set up for mixed, conditional spaces: multivariate, grouped (conditional parameters
    modelled jointly with their parent), constant liar (parallel hosts do not pile onto one
    region); startup trials are few because the baseline and the sweep seed it.
    """
    if name == "tpe":
        return optuna.samplers.TPESampler(
            multivariate=True, group=True, constant_liar=True, n_startup_trials=settings.startup_trials,
            seed=seed,
        )
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=settings.startup_trials, warn_independent_sampling=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(grid_space(space, settings.numeric_points), seed=seed)
    raise BadInput(f"unknown sampler {name!r}: choose one of {', '.join(SAMPLERS)}")



class Strategy:
    """One study's search policy; create it once per driver run and route every trial through it.

    Driver loop::

        strategy.start(study, known=[...])            # once: baseline + known configs
        trial, config = strategy.ask(study)
        ... start the server; on a crash: strategy.tell(study, trial, "crashed", failure=...)
        for each level: if not strategy.on_level(study, trial, step, concurrency, tok_s): stop
        strategy.tell(study, trial, outcome, objective=..., slo_ok=..., answers_differ=...)

    ``guided=False`` gives the plain sampler (no warm start, sweep, pruning or skipping): the
    benchmark's reference for what the guidance is worth. The parts can also be varied alone:
    ``settings`` (`search.settings.Settings`) holds every number, ``pruner`` is the ladder rules
    (`search.pruner.LadderPruner`; ``pruning=False`` leaves them out), ``memory`` the filter
    around the sampler that tells known crashes and repeats without running them
    (`search.memory.Memory`; ``memory=False`` leaves it out).
    """

    def __init__(
        self,
        space: SpaceLike,
        sampler: str | optuna.samplers.BaseSampler = "tpe",
        *,
        seed: int | None = None,
        guided: bool = True,
        pruning: bool = True,
        memory: bool = True,
        settings: Settings = DEFAULT,
    ) -> None:
        if space.baseline is None:
            raise BadInput("the strategy starts from a baseline: give the space a `baseline:` or pass --start-from")
        self.space = space
        self.baseline = dict(space.baseline)
        self.settings = settings
        self.sampler = make_sampler(sampler, space, seed, settings) if isinstance(sampler, str) else sampler
        self.guided = guided
        self._dists = discover(space)
        self.ranking = Ranking(self._dists, pooled=guided, settings=settings)
        # The ladder rules; None (unguided, or ``pruning=False`` to ablate them alone) runs every level.
        # Targets are output tok/s (per GPU, for that objective) by concurrency: they bound only an
        # output-throughput objective (a space without an objective, as a benchmark landscape's, has that one).
        objective = getattr(space, "objective", None)
        tok_s = objective is None or objective.metric.startswith("output_throughput")
        unit = "tok/s" if objective is None else objective.unit
        self.pruner = LadderPruner(space.targets if tok_s else {}, settings, unit=unit) if guided and pruning else None
        # Known crashes and repeats told without running; None (unguided, ``memory=False``) runs every proposal.
        self.memory = Memory(self._dists, settings) if guided and memory else None

    # -- warm start --------------------------------------------------------------------------
    def start(self, study: optuna.Study, known: Iterable[Mapping[str, Any]] = ()) -> None:
        """Enqueue the baseline first, then known configs (`--start-from`, `--from-study`).

        Only on a fresh study: a resumed study already holds them. The model's libraries load here
        too, before any trial runs (`search.surrogate.load`).
        """
        surrogate.load()
        if not self.guided or study.get_trials(deepcopy=False):
            return
        study.enqueue_trial(dict(self.baseline), user_attrs={Attr.PLAN: Plan.BASELINE})
        for config in known:
            if not same_config(config, self.baseline):
                study.enqueue_trial(dict(config), user_attrs={Attr.PLAN: Plan.KNOWN})

    # -- asking ------------------------------------------------------------------------------
    def ask(self, study: optuna.Study) -> tuple[optuna.Trial, dict[str, Any]]:
        """The next trial to run and its config; repeats and known crashes are told, not run.

        After ``max_skips`` of them in a row (a small space run through, or a sampler that has
        converged) the next proposal runs as it is: a repeat measures noise, and the study goes on.
        """
        batch = next_batch(self.history(study)) if self.guided else None
        if batch is not None:
            for config in batch.configs:
                study.enqueue_trial(dict(config), user_attrs={str(k): v for k, v in batch.attrs.items()})
        if self.memory is not None:
            trial, config = self.memory.ask(study, self.space.suggest)
        else:
            trial = study.ask()
            config = self.space.suggest(trial)
        if Attr.PLAN not in trial.user_attrs:
            trial.set_user_attr(Attr.PLAN, Plan.SAMPLER)
        return trial, config

    def history(self, study: optuna.Study) -> History:
        """The study as the plan reads it now: one snapshot of its trials, with this strategy's space,
        settings and memory."""
        return History(tuple(study.get_trials(deepcopy=False)), self._dists, self.baseline, self.space.suggest,
                       self.settings, self.memory)

    def incumbent(self, study: optuna.Study) -> TrialView | None:
        """The best completed trial meeting every constraint: the first one `top` ranks."""
        best = self.top(study, 1)
        return best[0] if best else None

    def on_level(self, study: optuna.Study, trial: optuna.Trial, step: int, concurrency: float, value: float) -> bool:
        """Report a ladder level (step = its index); False means prune the trial now (`LadderPruner`
        says why, kept as ``pruned_because``)."""
        trial.report(value, step)
        trial.set_user_attr(Attr.LADDER, [*trial.user_attrs.get(Attr.LADDER, [])[:step], concurrency])
        reason = None if self.pruner is None else self.pruner.why(study, step, concurrency, value)
        if reason is not None:
            trial.set_user_attr(Attr.PRUNED_BECAUSE, reason)
        return reason is None

    # -- telling -----------------------------------------------------------------------------
    def tell(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        outcome: Outcome,
        *,
        objective: float | None = None,
        slo_ok: bool = True,
        answers_differ: bool = False,
        failure: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a trial's outcome the way the sampler learns most from it.

        completed -> COMPLETE with the objective; crashed -> PRUNED, crashed = 1; pruned ->
        PRUNED (its last reported level stands in); infrastructure -> FAIL and the same params
        enqueued again. Constraints are set on every trial told here.
        """
        outcome = Outcome(outcome)  # a ValueError naming the outcome for anything else
        trial.set_user_attr(Attr.OUTCOME, outcome)
        if failure is not None:
            trial.set_user_attr(Attr.FAILURE, dict(failure))
        if outcome == Outcome.INFRASTRUCTURE:
            attrs = {k: v for k, v in trial.user_attrs.items() if k in _PLAN_NOTES}
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial(dict(trial.params), user_attrs={**attrs, Attr.RETRY_OF: trial.number})
            return
        set_constraints(trial, crashed=outcome == Outcome.CRASHED, slo_ok=slo_ok, answers_differ=answers_differ)
        if outcome == Outcome.COMPLETED:
            if objective is None:
                raise ValueError("a completed trial needs its objective")
            study.tell(trial, objective)
        else:
            study.tell(trial, state=TrialState.PRUNED)

    def top(self, study: optuna.Study, k: int = 3) -> list[TrialView]:
        """The k best feasible trials of distinct configs, as `search.ranking` orders them: what the end re-measures.

        The plain sampler (``guided=False``) ranks by measured value, as Optuna's ``best_trial`` does.
        """
        return self.ranking.top(views(study), k)


def configs_of(grid: Mapping[str, Sequence[Any]], space: SpaceLike) -> list[dict[str, Any]]:
    """Every distinct config on a grid, conditions honoured (inactive parameters dropped)."""
    names = list(grid)
    seen: set[tuple[tuple[str, Any], ...]] = set()
    out: list[dict[str, Any]] = []
    for combo in itertools.product(*(grid[n] for n in names)):
        config = space.suggest(optuna.trial.FixedTrial(dict(zip(names, combo, strict=True))))
        key = tuple(sorted(config.items(), key=lambda kv: kv[0]))
        if key not in seen:
            seen.add(key)
            out.append(config)
    return out
