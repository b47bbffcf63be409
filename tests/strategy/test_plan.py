"""The plan's sources: functions of one history snapshot, each callable, and ablated, alone."""

from __future__ import annotations

from typing import Any

import optuna

from search.plan import EDGE_PASS, History, combine, edge, next_batch, revisit, sources, worth_running
from search.settings import DEFAULT, PLAN_SOURCES, Settings
from search.storage import Attr, Plan
from search.strategy import Strategy
from tests.strategy.fixture import FixtureSpace


def _history(runs: list[tuple[dict[str, Any], float | None, dict[str, Any]]], settings: Settings = DEFAULT) -> History:
    """A study of the fixture space whose trials completed at the given values (None: crashed) with the given plan notes."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = FixtureSpace()
    strategy = Strategy(space, seed=0, settings=settings)
    study = optuna.create_study(direction="maximize", sampler=strategy.sampler)
    for change, value, notes in runs:
        study.enqueue_trial({**space.baseline, **change}, user_attrs=notes)
        trial = study.ask()
        space.suggest(trial)
        if value is None:
            strategy.tell(study, trial, "crashed", failure={"kind": "oom", "phase": "cuda_graph", "line": "CUDA out of memory"})
        else:
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


MEM = "--mem-fraction-static"


def _mem(value: float, score: float | None, pass_: int = -1) -> tuple[dict[str, Any], float | None, dict[str, Any]]:
    """A move of the memory fraction alone from the baseline (0.88, 1000 tok/s)."""
    return ({MEM: value}, score, {Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: MEM, Attr.SWEEP_PASS: pass_,
                                  Attr.SWEEP_FROM_WORKING: True, Attr.CENTRE_SCORE: 1000.0, Attr.SWEEP_FROM: 0.88})


def _edge_moves(h: History) -> list[float]:
    return [batch.configs[0][MEM] for advised in (True, False) for batch in edge(h, advised) if worth_running(h, batch)]


def test_a_crashing_move_is_bisected_toward_from_the_centre_while_the_midpoints_win() -> None:
    base = ({}, 1000.0, {Attr.PLAN: Plan.BASELINE})
    # 0.95 crashed (graph capture out of memory): the midpoint of 0.88 and 0.95 on the 0.01 steps.
    assert _edge_moves(_history([base, _mem(0.95, None)])) == [0.91]
    # 0.91 won: it is the centre, and the next midpoint is bisected from it.
    h = _history([base, _mem(0.95, None), _mem(0.91, 1200.0, EDGE_PASS)])
    assert h.centre[0][MEM] == 0.91 and _edge_moves(h) == [0.93]
    # 0.93 crashed too: the edge is narrower, between 0.91 and 0.93.
    assert _edge_moves(_history([base, _mem(0.95, None), _mem(0.91, 1200.0, EDGE_PASS),
                                 _mem(0.93, None, EDGE_PASS)])) == [0.92]
    # A midpoint that runs without winning ends the search on that side; so does an edge within
    # edge_close of the range (1/16 of 0.15: one step of 0.01) of the centre.
    assert _edge_moves(_history([base, _mem(0.95, None), _mem(0.91, 1010.0, EDGE_PASS)])) == []
    assert _edge_moves(_history([base, _mem(0.89, None)])) == []


def test_a_midpoint_that_crashes_is_not_repaired_and_edge_can_be_left_out() -> None:
    h = _history([({}, 1000.0, {Attr.PLAN: Plan.BASELINE}), _mem(0.95, None), _mem(0.91, None, EDGE_PASS)])
    batch = next_batch(h)  # the edge narrowed to 0.88-0.91: the next midpoint, not a repair of 0.91
    assert batch is not None and batch.attrs[Attr.PLAN] == Plan.SWEEP and batch.configs[0][MEM] == 0.89
    repairs = next_batch(_history([({}, 1000.0, {Attr.PLAN: Plan.BASELINE}), _mem(0.95, None)],
                                  Settings(plan_off=("edge",))))
    assert repairs is not None and repairs.attrs[Attr.PLAN] == Plan.PARTNER
    assert {c[MEM] for c in repairs.configs} == {0.95}


CAP = "--max-running-requests"


def test_the_centre_is_uncapped_only_while_an_uncapped_config_comes_close_to_the_best() -> None:
    """The baseline's cap of 64 sits below the ladder's top (256): its ladder shows only part of the
    curve, so an uncapped config is the centre while it is within uncapped_margin (10%) of it; one
    a quarter slower (a KV-cache knee past the cap) is not, and the sweeps go on from the capped best."""
    def runs(uncapped: float) -> list[tuple[dict[str, Any], float | None, dict[str, Any]]]:
        return [({}, 1000.0, {Attr.PLAN: Plan.BASELINE, Attr.LADDER: [64, 256]}),
                ({CAP: 2048}, uncapped, {**_screen(CAP, 2048, uncapped)[2], Attr.LADDER: [64, 256]})]
    assert _history(runs(950.0)).centre[0][CAP] == 2048
    assert _history(runs(750.0)).centre[0][CAP] == 64
    assert _history(runs(750.0), Settings(uncapped_margin=1.0)).centre[0][CAP] == 2048  # before: any uncapped one
