"""The plan's sources: functions of one history snapshot, each callable, and ablated, alone."""

from __future__ import annotations

from typing import Any

import optuna

from search.plan import History, combine, next_batch, revisit, sources, worth_running
from search.settings import DEFAULT, PLAN_SOURCES, Settings
from search.storage import Attr, Plan
from search.strategy import Strategy
from tests.strategy.fixture import FixtureSpace


def _history(runs: list[tuple[dict[str, Any], float, dict[str, Any]]], settings: Settings = DEFAULT) -> History:
    """A study of the fixture space whose trials completed at the given values with the given plan notes."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = FixtureSpace()
    strategy = Strategy(space, seed=0, settings=settings)
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler)
    for change, value, notes in runs:
        study.enqueue_trial({**space.baseline, **change}, user_attrs=notes)
        trial = study.ask()
        space.suggest(trial)
        strategy.tell(study, trial, "completed", objective=value)
    return strategy.history(study)


# The screens are done: two changed throughput within noise (+3%, +2%), so neither moved the centre
# off the baseline and neither parameter is swept; the other four changed nothing.
def _screen(name: str, value: Any, score: float) -> tuple[dict[str, Any], float, dict[str, Any]]:
    return ({name: value}, score, {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: name, Attr.SWEEP_PASS: -1,
                                   Attr.SWEEP_FROM_WORKING: True, Attr.CENTRE_SCORE: 1000.0,
                                   Attr.SWEEP_FROM: FixtureSpace.baseline[name]})


SCREENED = [({}, 1000.0, {Attr.PLAN: Plan.BASELINE}), _screen("NCCL_MIN_NCHANNELS", 16, 1030.0),
            _screen("--moe-runner-backend", "triton", 1020.0)] + [
    ({}, 1000.0, {**_screen(name, None, 0.0)[2], Attr.SWEEP_FROM: None})
    for name in ("--max-running-requests", "--disable-cuda-graph", "--cuda-graph-max-bs-decode", "--mem-fraction-static")]


def test_a_source_reads_only_its_snapshot_and_proposes_the_same_each_time() -> None:
    h = _history(SCREENED)
    assert h.centre == (FixtureSpace.baseline, True)
    [batch] = list(combine(h))
    assert batch.configs == [{**FixtureSpace.baseline, "NCCL_MIN_NCHANNELS": 16, "--moe-runner-backend": "triton"}]
    assert batch.attrs[Attr.SWEEP_PARAM] == "combined"
    assert list(combine(h)) == [batch]
    # A revisit of a win on the centre it was measured on is the config that ran: none worth running.
    again = list(revisit(h))  # NCCL's +3% (triton's +2% is not above revisit_margin)
    assert len(again) == 1 and worth_running(h, again[0]) == []


def test_every_source_settings_can_leave_out_is_one_the_planner_consults() -> None:
    names = [name for name, _ in sources(_history([]))]
    assert set(names) == {*PLAN_SOURCES, "screen"}  # the screen is switched by Settings.screen


def test_a_source_left_out_is_passed_over_for_the_next() -> None:
    """Nothing mattered in the screens, so the combined move is next; without it, the next source:
    the backend's other choices (an unordered categorical's one screen says little of the rest)."""
    everything = next_batch(_history(SCREENED))
    assert everything is not None and everything.attrs[Attr.SWEEP_PARAM] == "combined"
    without = next_batch(_history(SCREENED, Settings(plan_off=("combine",))))
    assert without is not None and without.attrs[Attr.SWEEP_PARAM] == "--moe-runner-backend"
    assert len(without.configs) == 3  # the backends other than the centre's and the screened triton


CAP = "--max-running-requests"


def test_the_centre_is_uncapped_only_while_an_uncapped_config_comes_close_to_the_best() -> None:
    """The baseline's cap of 64 sits below the ladder's top (256): its ladder shows only part of the
    curve, so an uncapped config is the centre while it is within uncapped_margin (10%) of it; one
    a quarter slower (a KV-cache knee past the cap) is not, and the sweeps go on from the capped best."""
    def runs(uncapped: float) -> list[tuple[dict[str, Any], float, dict[str, Any]]]:
        return [({}, 1000.0, {Attr.PLAN: Plan.BASELINE, Attr.LADDER: [64, 256]}),
                ({CAP: 2048}, uncapped, {**_screen(CAP, 2048, uncapped)[2], Attr.LADDER: [64, 256]})]
    assert _history(runs(950.0)).centre[0][CAP] == 2048
    assert _history(runs(750.0)).centre[0][CAP] == 64
    assert _history(runs(750.0), Settings(uncapped_margin=1.0)).centre[0][CAP] == 2048  # before: any uncapped one
