"""Structural errors: every one reported with file and key, in our words."""

from __future__ import annotations

import copy

import optuna
import pytest

from search.space import SpaceError, load_space, parse_space
from tests.space.conftest import MINIMAL


def _problems(write_space, data: dict) -> list[str]:
    path = write_space(data)
    with pytest.raises(SpaceError) as info:
        load_space(path)
    return [str(p) for p in info.value.problems]


def test_every_structural_problem_is_reported_with_file_and_key(write_space) -> None:
    data = copy.deepcopy(MINIMAL)
    data["launch"]["tp"] = 0
    data["launch"]["bogus"] = 1
    data["params"]["--cuda-graph-max-bs"]["low"] = 512          # empty range
    data["params"]["--x"] = {"type": "floaty"}
    data["params"]["--y"] = {"type": "categorical", "choices": []}
    data["load_test"] = {"api": "grpc", "concurrency": [256, 64]}
    lines = _problems(write_space, data)
    path = str(write_space(data))
    assert all(line.startswith(f"{path}: ") for line in lines)
    text = "\n".join(lines)
    assert f"{path}: launch.tp: Input should be greater than 0" in text
    assert "launch.bogus: unknown key (allowed: launcher, model, tp, quantization" in text
    assert "params.--cuda-graph-max-bs: empty range: low 512 > high 256" in text
    assert "params.--x: unknown param type 'floaty' (allowed: int, float, categorical, bool)" in text
    assert "params.--y.choices: List should have at least 1 item" in text
    assert "load_test.api: unknown value 'grpc'" in text
    assert "load_test.concurrency: concurrency must rise strictly, got [256, 64]" in text
    assert len(lines) == 7


def test_missing_model_and_version(write_space) -> None:
    lines = _problems(write_space, {"launch": {}})
    assert any(line.endswith("sglang_version: required key missing") for line in lines)
    assert any(line.endswith("launch.model: required key missing") for line in lines)


def test_defaults_fill_timeouts_and_load_test() -> None:
    space = parse_space(copy.deepcopy(MINIMAL))
    assert space.timeouts["loading"] == 1800 and space.timeouts["autotune"] == 900
    assert set(space.timeouts) == {"starting", "loading", "kv_cache", "autotune", "cuda_graph", "warmup"}
    assert space.load_test.duration_s == 120 and space.load_test.requests is None
    assert space.objective.metric == "output_throughput" and space.objective.require_slos


def test_suggest_honours_conditions_and_types() -> None:
    space = parse_space(copy.deepcopy(MINIMAL))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen_on = seen_off = False
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial)
        assert config == pytest.approx(trial.params)  # optuna param names are our param names
        assert space.config_problems(config, "x") == []
        if config["--disable-cuda-graph"]:
            seen_off = True
            assert "--cuda-graph-max-bs" not in config
        else:
            seen_on = True
            assert config["--cuda-graph-max-bs"] % 16 == 0
        assert isinstance(config["--disable-cuda-graph"], bool)
        assert config["--mem-fraction-static"] == round(config["--mem-fraction-static"], 2)
        study.tell(trial, 1.0)
    assert seen_on and seen_off
    assert set(space.distributions()) == set(MINIMAL["params"])


def test_active_drops_params_whose_condition_fails() -> None:
    space = parse_space(copy.deepcopy(MINIMAL))
    config = {"--disable-cuda-graph": True, "--cuda-graph-max-bs": 64, "--max-running-requests": None}
    assert space.active(config) == {"--disable-cuda-graph": True, "--max-running-requests": None}


def test_when_accepts_one_of_several_values() -> None:
    data = copy.deepcopy(MINIMAL)
    data["params"]["--cuda-graph-max-bs"]["when"] = {"--max-running-requests": [64, 256]}
    space = parse_space(data)
    assert space.is_active("--cuda-graph-max-bs", {"--max-running-requests": 256})
    assert not space.is_active("--cuda-graph-max-bs", {"--max-running-requests": None})


def test_load_test_workers_reach_the_ladder(write_space) -> None:
    from search.trial import ladder_spec
    data = copy.deepcopy(MINIMAL)
    assert ladder_spec(load_space(write_space(data))).workers is None  # auto by default
    data["load_test"] = {"workers": 3}
    assert ladder_spec(load_space(write_space(data))).workers == 3
    data["load_test"] = {"workers": 0}
    assert any("load_test.workers: Input should be greater than 0" in p for p in _problems(write_space, data))


@pytest.mark.parametrize("param, line", [
    ({"type": "int", "low": 512, "high": 16},
     "params.--p: empty range: low 512 > high 16 (allowed: low <= high, e.g. low: 16, high: 512)"),
    ({"type": "float", "low": 0, "high": 1, "log": True},
     "params.--p: log scale needs low > 0, got 0 (allowed: low > 0, or log: false)"),
    ({"type": "float", "low": 0.1, "high": 1, "log": True, "step": 0.1},
     "params.--p: log scale cannot have a step (allowed: no step with log: true, or log: false)"),
    ({"type": "int", "low": 1, "high": 4, "step": 8},
     "params.--p: step 8 is wider than the range 1..4 (allowed: step <= 3 (high - low))"),
])
def test_empty_ranges_say_what_is_allowed(write_space, param: dict, line: str) -> None:
    data = copy.deepcopy(MINIMAL)
    data["params"]["--p"] = param
    assert _problems(write_space, data) == [f"{write_space(data)}: {line}"]


def test_problems_behind_a_broken_entry_are_reported_too(write_space) -> None:
    data = copy.deepcopy(MINIMAL)
    data["load_test"] = {"input_len": 0, "duration_s": 5, "requests": 10}  # the second shows once the first is out
    path = write_space(data)
    assert _problems(write_space, data) == [f"{path}: load_test.input_len: Input should be greater than 0",
                                            f"{path}: load_test: give duration_s or requests per level, not both"]
