"""What `study show` lists: trials that ran, only the changes that matter, and what the GPUs did."""

from __future__ import annotations

import io
import json
from csv import DictReader
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from search.results import changed, gpu_text, ranked, render
from search.space import load_space
from search.storage import StudyAttr
from tests.helpers import write_space


def test_a_planned_trial_still_waiting_is_not_a_result(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.SPACE, load_space(write_space(tmp_path)).model_dump(mode="json"))
    ran = study.ask()
    ran.suggest_int("--cuda-graph-max-bs", 64, 512)
    study.tell(ran, 900.0)
    study.enqueue_trial({"--cuda-graph-max-bs": 128})  # planned, never run before the run ended
    assert [t.number for t in ranked(study)] == [ran.number]


def test_changed_lists_values_and_defaults_but_not_params_gone_inactive() -> None:
    baseline = {"--disable-cuda-graph": False, "--cuda-graph-max-bs": 256, "--max-running-requests": 64}
    config = {"--disable-cuda-graph": True, "--max-running-requests": None}
    assert changed(config, baseline) == "--disable-cuda-graph=True --max-running-requests=default"


def _gpu_study(tmp_path: Path) -> optuna.Study:
    """A study (in memory) with the three kinds of trial whose GPU use matters: best, pruned, SLO missed."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(write_space(tmp_path))
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.SPACE, space.model_dump(mode="json"))
    dist = {"--max-running-requests": CategoricalDistribution([1, None])}

    def level(c: int, tok_s: float) -> dict[str, Any]:
        return {"max_concurrency": c, "output_throughput": tok_s, "request_throughput": 1.0,
                "p99_ttft_ms": 100.0, "p99_itl_ms": 10.0, "errors": {}}

    def add(state: TrialState, value: float | None, levels: list[dict[str, Any]], gpu: list[dict[str, Any]],
            **attrs: Any) -> None:
        study.add_trial(create_trial(state=state, value=value, params={"--max-running-requests": None},
                                     distributions=dist, user_attrs={"levels": levels, "gpu": gpu, **attrs},
                                     intermediate_values={0: levels[0]["output_throughput"]}))

    add(TrialState.COMPLETE, 900.0, [level(4, 500), level(16, 900)],
        [{"concurrency": 4, "power_w": 310.0, "power_limit_w": 600.0, "utilization_pct": 40.0},
         {"concurrency": 16, "power_w": 520.4, "power_limit_w": 600.0, "utilization_pct": 91.0}],
        outcome="completed", peak_output_throughput=900.0, peak_concurrency=16)
    add(TrialState.PRUNED, None, [level(4, 120)],  # the seed's case: GPUs near idle, no peak level
        [{"concurrency": 4, "power_w": 250.0, "power_limit_w": 600.0, "utilization_pct": 12.0}],
        outcome="pruned", pruned_because="below target")
    add(TrialState.COMPLETE, 700.0, [level(4, 400), level(16, 700)],  # no level met the SLOs
        [{"concurrency": 4, "power_w": 280.0, "power_limit_w": None, "utilization_pct": None},
         {"concurrency": 16, "power_w": 455.0, "power_limit_w": 600.0, "utilization_pct": 77.5}],
        outcome="completed")
    return study


def _number(cell: str) -> float | None:
    return float(cell) if cell else None


def test_show_gives_gpu_power_and_utilization_at_the_highest_level_even_without_a_peak(tmp_path: Path) -> None:
    study = _gpu_study(tmp_path)
    text = render(study, "table")
    for shown in ("520/600 W 91% @16", "250/600 W 12% @4", "455/600 W 78% @16"):
        assert shown in text, text

    rows = {r["trial"]: r for r in json.loads(render(study, "json"))["trials"]}
    assert rows[1]["gpu_power"] == "250/600 W 12%" and rows[1]["gpu_at"] == 4 and rows[1]["gpu_limit_w"] == 600.0
    assert (rows[0]["gpu_w@4"], rows[0]["gpu_util@4"], rows[0]["gpu_w@16"], rows[0]["gpu_util@16"]) == (310.0, 40.0, 520.4, 91.0)
    assert (rows[1]["gpu_w@16"], rows[1]["gpu_util@16"]) == (None, None)  # never reached
    assert (rows[2]["gpu_w@4"], rows[2]["gpu_util@4"]) == (280.0, None)  # utilization not reported there

    csv = list(DictReader(io.StringIO(render(study, "csv"))))
    assert [(r["trial"], _number(r["gpu_w@4"]), _number(r["gpu_util@4"])) for r in csv] == [
        ("0", 310.0, 40.0), ("2", 280.0, None), ("1", 250.0, 12.0)]
    assert gpu_text({"concurrency": 4, "power_w": 280.0, "power_limit_w": None, "utilization_pct": None}) == "280 W"


def test_show_names_a_goodput_objective_and_its_unit(tmp_path: Path) -> None:
    """A study tuned for goodput says so, in req/s, in the table title, its JSON and the gain line."""
    space = load_space(write_space(tmp_path)).model_dump(mode="json")
    space["objective"] = {**space["objective"], "metric": "goodput", "goodput_slos_ms": {"ttft": 2000, "tpot": 50}}
    study = optuna.create_study(direction="maximize")
    study.set_user_attr(StudyAttr.SPACE, space)
    dist = {"--max-running-requests": CategoricalDistribution([1, None])}
    for number, (value, cap) in enumerate([(3.25, 1), (5.5, None)]):
        study.add_trial(create_trial(
            state=TrialState.COMPLETE, value=value, params={"--max-running-requests": cap}, distributions=dist,
            user_attrs={"levels": [], "outcome": "completed", "peak_output_throughput": value, "peak_concurrency": 4,
                        **({"strategy": "baseline"} if number == 0 else {})}))
    text = render(study, "table")
    assert "goodput (ttft<=2000ms, tpot<=50ms), req/s" in text
    assert json.loads(render(study, "json"))["objective"] == {"metric": "goodput (ttft<=2000ms, tpot<=50ms)",
                                                                "unit": "req/s"}
    gain = next(line for line in text.splitlines() if line.startswith("gain:"))
    assert "5.50 req/s" in gain and "3.25 req/s" in gain, gain
