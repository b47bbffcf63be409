"""A study whose levels are request rates: every chart, the headline and `study show` read them as
rates, never as the concurrency field the client also records."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from search import report, results
from search.space import load_space
from search.storage import Attr, Constraint, Outcome, StudyAttr, space_of
from tests.helpers import write_space

RATES = [2.0, 8.0]
FEASIBLE = {Constraint.CRASHED: 0.0, Constraint.SLO: 0.0, Constraint.CORRECTNESS: 0.0}


def _study(root: Path) -> tuple[optuna.Study, str]:
    space_file = write_space(root, params={"--max-running-requests": {"type": "int", "low": 8, "high": 1024, "log": True}},
                        baseline={"--max-running-requests": 64}, targets={},
                        load_test={"input_len": 32, "output_len": 32, "request_rates": RATES, "requests": 20,
                                   "duration_s": None, "warmup_s": 0})
    loaded = load_space(space_file)
    storage = f"sqlite:///{root / 'studies.db'}"
    study = optuna.create_study(study_name="rates", storage=storage, direction="maximize")
    study.set_user_attr(StudyAttr.SPACE, loaded.model_dump(mode="json"))
    for number, (cap, tok_s) in enumerate(((64, 400.0), (256, 900.0))):
        # The client records the cap on in-flight requests as max_concurrency (here 1024) whatever the rate.
        levels = [{"max_concurrency": 1024, "request_rate": rate, "output_throughput": tok_s * rate / RATES[-1],
                   "request_throughput": rate, "p99_ttft_ms": 50.0, "p99_itl_ms": 5.0, "errors": {}} for rate in RATES]
        gpu = [{"concurrency": rate, "power_w": 300.0 + 10 * rate, "power_limit_w": 700.0, "utilization_pct": 50.0}
               for rate in RATES]
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=tok_s, params={"--max-running-requests": cap},
            distributions={"--max-running-requests": IntDistribution(8, 1024, log=True)}, constraints=FEASIBLE,
            intermediate_values={0: tok_s},
            user_attrs={Attr.PLAN: "baseline" if number == 0 else "sweep", Attr.OUTCOME: Outcome.COMPLETED,
                        Attr.PEAK: tok_s, Attr.PEAK_CONCURRENCY: RATES[-1], Attr.LEVELS: levels, Attr.GPU: gpu}))
    return study, storage


def test_charts_headline_and_table_put_levels_at_their_request_rates(tmp_path: Path) -> None:
    study, storage = _study(tmp_path)
    charts = {s.key: s for s in report.sections(study, space_of(study))}
    for key in ("ladder", "power"):
        fig = charts[key].figure
        assert fig is not None, key
        assert {x for trace in fig.data if trace.name != "target" for x in trace.x} == set(RATES), key
        assert fig.layout.xaxis.title.text == "request rate (req/s)", key
        assert list(fig.layout.xaxis.tickvals) == RATES, key
    assert charts["ladder"].title == "Throughput against request rate"
    page = report.render(study, storage)
    assert "peak at 8 req/s" in page and "request rate 2, 8" in page
    assert "concurrency 1024" not in page and not re.search(r"at 1024\b", page)
    shown = json.loads(results.render(study, "json"))
    assert {"tok_s@2/s", "tok_s@8/s"} <= set(shown["trials"][0])
