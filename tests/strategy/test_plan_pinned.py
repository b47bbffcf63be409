"""The plan's proposals, pinned: a study driven by the product's `StudyRun` proposes, trial for trial,
what it proposed when `tests/strategy/pinned_proposals.json` was recorded.

Refactors of the plan (moving its sources, the settings, the memory) must not change what a study
tries; a change of behaviour is measured on the benchmark first, then recorded here on purpose
(``PYTHONPATH=. python3 tests/strategy/test_plan_pinned.py`` rewrites the file). The cases cover
every source of the plan: screens, sweeps, repairs, the edge bisection, revisits, the combined
move, the cap read off the ladder, the model, the sampler and a crashing baseline.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import optuna
import pytest

from search.settings import DEFAULT, Settings
from search.storage import Attr
from search.strategy import Strategy
from search.study import StudyRun
from tests.strategy.test_generator import ROOT, SPACE, bench, generator

PINNED = Path(__file__).with_name("pinned_proposals.json")
# (name, landscape: a generated seed or a hand-written file, trials): between them every source of
# the plan runs (generated 8: cap reads; 12: the edge bisection, skipped proposals; 14: repairs;
# backend_crash: a crashing baseline, the second pass, the combined move, a revisit, the model, the sampler).
CASES: list[tuple[str, int | str, int]] = [
    ("generated-8", 8, 20),
    ("generated-12", 12, 32),
    ("generated-14", 14, 10),
    ("backend_crash", "scripts/landscapes/backend_crash.py", 28),
]


def record(landscape: int | str, n_trials: int, seed: int = 0, settings: Settings = DEFAULT) -> list[dict[str, Any]]:
    """Each trial of one driven study, in order: the plan's tag and notes, its state and config."""
    from bench_runner import LandscapeRunner  # on sys.path once bench_search is imported

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if isinstance(landscape, int):
        problem, land = bench.load_problem(SPACE), generator.make(landscape)
        noise = land.noise
    else:
        problem, land = bench.load_problem(ROOT / "scripts" / "landscapes" / "space.yaml"), bench.load_landscape(ROOT / landscape)
        noise = 0.025
    sim = bench.Simulator(problem, land)
    with tempfile.TemporaryDirectory() as tmp:
        run = StudyRun(space=problem.space, name="pinned", storage="sqlite:///:memory:", seed=seed, n_trials=n_trials,
                       remeasure=0, trials_dir=Path(tmp) / "trials", runner=LandscapeRunner(sim, noise, seed),
                       searcher=Strategy(problem.space, "tpe", seed=seed, settings=settings))
        study = run.run()
    notes = (Attr.PLAN, Attr.SWEEP_PARAM, Attr.SWEEP_PASS, Attr.PARTNER_OF, Attr.SKIPPED)
    return [{"state": t.state.name, **{k: t.user_attrs[k] for k in notes if k in t.user_attrs}, "params": t.params}
            for t in study.get_trials(deepcopy=False)]


@pytest.mark.parametrize(("name", "landscape", "n_trials"), CASES, ids=[c[0] for c in CASES])
def test_a_driven_study_proposes_what_it_proposed_when_pinned(name: str, landscape: int | str, n_trials: int) -> None:
    expected = json.loads(PINNED.read_text(encoding="utf-8"))[name]
    assert json.loads(json.dumps(record(landscape, n_trials))) == expected


if __name__ == "__main__":  # one trial a line, so a deliberate change reads as a diff of the trials it moved
    PINNED.write_text("{\n" + ",\n".join(
        f"{json.dumps(name)}: [\n" + ",\n".join(json.dumps(t) for t in record(land, n)) + "\n]" for name, land, n in CASES
    ) + "\n}\n", encoding="utf-8")
