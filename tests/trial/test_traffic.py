"""A space's workload and goodput objective, end to end through a trial on the emulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from search.hosts.emulated import EmulatedHost
from search.manifests import load as load_manifest
from search.space import SpaceError, load_space, parse_space
from search.space_check import check_space
from search.trial import ladder_spec, run_trial


def _with(space_file: Path, **sections: object) -> Path:
    data = yaml.safe_load(space_file.read_text())
    data.update(sections)
    space_file.write_text(yaml.safe_dump(data))
    return space_file


def test_a_dataset_workload_tuned_for_goodput(space_file: Path, tmp_path: Path) -> None:
    """The request log next to the space is replayed; the trial's objective is the best level's goodput."""
    (space_file.parent / "log.jsonl").write_text(
        "".join(json.dumps({"prompt": f"request {i} " * 4, "output_len": 8 + i % 8}) + "\n" for i in range(30)))
    _with(space_file, workload={"kind": "dataset", "file": "log.jsonl"},
          objective={"metric": "goodput", "goodput_slos_ms": {"ttft": 5000, "e2el": 10000}})
    space = load_space(space_file)
    assert ladder_spec(space).dataset == str(space_file.parent / "log.jsonl")
    assert space.objective.unit == "req/s" and space.objective.name == "goodput (ttft<=5000ms, e2el<=10000ms)"
    result = run_trial(space, space.baseline, EmulatedHost(), trial_dir=tmp_path / "t" / "0", marker="t-goodput",
                       baseline_answers=None)
    assert result.outcome == "completed", result.failure
    goodputs = [lv.request_goodput for lv in result.levels]
    assert all(g is not None and g > 0 for g in goodputs)  # the emulator answers well within these SLOs
    assert result.objective == max(goodputs)  # type: ignore[type-var]
    assert all(lv.slo_attainment == 1.0 for lv in result.levels)
    assert result.objective < min(lv.output_throughput for lv in result.levels)  # req/s, not tok/s


def test_workload_problems_are_one_line_each(space_file: Path) -> None:
    data = yaml.safe_load(space_file.read_text())
    cases = [
        ({"workload": {"kind": "dataset"}}, "workload", "needs file"),
        ({"workload": {"kind": "random", "groups": 4}}, "workload", "do not apply to a random workload"),
        ({"workload": {"kind": "random", "range_ratio": 0}}, "workload.range_ratio", "greater than 0"),
        ({"objective": {"metric": "goodput"}}, "objective", "needs goodput_slos_ms"),
        ({"objective": {"metric": "goodput", "goodput_slos_ms": {"itl": 5}}}, "objective.goodput_slos_ms", ""),
    ]
    for section, key, message in cases:
        with pytest.raises(SpaceError) as err:
            parse_space({**data, **section}, "s.yaml")
        assert any(p.key.startswith(key) and message in p.message for p in err.value.problems), err.value.problems
    missing = parse_space({**data, "workload": {"kind": "dataset", "file": "nowhere.jsonl"}}, str(space_file))
    problems = check_space(missing, load_manifest("0.5.23")).problems
    assert [p.key for p in problems] == ["workload.file"] and "cannot read it" in problems[0].message


def test_shared_prefix_space_sets_the_prompt_length(space_file: Path) -> None:
    _with(space_file, workload={"kind": "shared_prefix", "groups": 2, "prompts_per_group": 4,
                                "system_prompt_len": 100, "question_len": 20})
    spec = ladder_spec(load_space(space_file))
    assert spec.shared_prefix is not None and spec.input_len == 120


def test_every_shipped_example_space_checks_clean() -> None:
    root = Path(__file__).resolve().parents[2] / "spaces"
    for path in sorted(root.glob("*.yaml")):
        space = load_space(path)
        report = check_space(space, load_manifest(space.sglang_version))
        assert report.ok, (path, report.problems)
    kinds = {load_space(p).workload.kind for p in root.glob("*.yaml")}
    assert kinds == {"random", "dataset", "shared_prefix"}


def test_max_rate_under_slo_climbs_rates_then_bisects(space_file: Path, tmp_path: Path) -> None:
    """A server of known capacity: 8 running requests of 32 tokens at 400 tok/s each serve 100 req/s.
    Well under it p99 TTFT is a few ms; past it the queue grows through the level. The trial climbs
    the rates until one misses the SLO, bisects three more levels between the last rate that met it
    and that one, and scores the highest rate that met it, in req/s."""
    _with(space_file, load_test={"input_len": 16, "output_len": 32, "request_rates": [60, 300], "requests": 60,
                                 "warmup_s": 0},
          slos={"p99_ttft_ms": 150}, objective={"metric": "max_rate_under_slo"},
          baseline={"--max-running-requests": 8, "TEST_OUTCOME": "ok"})
    space = load_space(space_file)
    assert space.objective.unit == "req/s" and space.objective.name == "max rate under slo"
    spec = ladder_spec(space)
    assert spec.rate_slos == {"p99_ttft_ms": 150} and spec.rate_search_steps == 3
    result = run_trial(space, space.baseline, EmulatedHost(), trial_dir=tmp_path / "t" / "0", marker="t-rate",
                       baseline_answers=None)
    assert result.outcome == "completed", result.failure
    rates = [lv.request_rate for lv in result.levels]
    assert rates[:2] == [60, 300] and len(rates) == 5, rates  # 300 is 3x the capacity: missed, then 3 bisections
    met = [lv.request_rate for lv in result.levels if lv.p99_ttft_ms is not None and lv.p99_ttft_ms <= 150]
    assert 60 in met and 300 not in met
    assert result.objective == max(met)  # type: ignore[type-var]
    assert 60 <= result.objective < 300  # type: ignore[operator]
    low, high = 60.0, 300.0
    for rate in rates[2:]:  # each bisects the bracket the levels before it left
        assert rate == (low + high) / 2, rates
        low, high = (rate, high) if rate in met else (low, rate)
    assert json.loads((tmp_path / "t" / "0" / "loadtest.json").read_text())["max_rate_under_slo"] == result.objective


def test_max_rate_under_slo_needs_rates_and_slos(space_file: Path) -> None:
    data = yaml.safe_load(space_file.read_text())
    with pytest.raises(SpaceError) as err:
        parse_space({**data, "objective": {"metric": "max_rate_under_slo"}}, "s.yaml")
    assert "needs load_test.request_rates and slos" in str(err.value.problems)
