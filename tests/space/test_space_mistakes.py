"""Mistakes a space file makes silently: a key given twice (the last would win) and a step that
never reaches the declared high. `space check` names each, exit 2."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

from search.errors import BadInput
from search.hosts.config import load_hosts
from tests.space.conftest import MINIMAL

Cli = Callable[..., tuple[int, str, str]]


SPACE_WITH_TWICE = """\
sglang_version: 0.5.9
launch: {model: m, tp: 2}
params:
  --max-running-requests: {type: categorical, choices: [null, 64, 256]}
  NCCL_MIN_NCHANNELS: {type: categorical, choices: [null, 4, 8]}
  --max-running-requests: {type: categorical, choices: [1]}
baseline: {NCCL_MIN_NCHANNELS: 4}
baseline: {NCCL_MIN_NCHANNELS: 8}
"""


def test_a_key_given_twice_names_the_key_and_both_lines(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE_WITH_TWICE)
    code, out, err = cli("space", "check", str(path))
    assert code == 2
    why = "(the later one would silently win); keep one"
    assert out.splitlines() == [f"{path}: params.--max-running-requests: given twice, on lines 4 and 6 {why}",
                                f"{path}: baseline: given twice, on lines 7 and 8 {why}"]
    assert err.count("\n") == 1 and err.startswith("error: ")


def test_a_key_given_twice_in_the_hosts_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  - name: a\n    address: 10.0.0.1\n    address: 10.0.0.2\n")
    with pytest.raises(BadInput, match=r"hosts\.yaml: hosts\.0\.address: given twice, on lines 3 and 4"):
        load_hosts(path)


@pytest.mark.parametrize("param, message", [
    ({"type": "float", "low": 0.5, "high": 0.9, "step": 0.15},
     "step 0.15 from low 0.5 never reaches high 0.9 (allowed: high: 0.8 (the nearest below) or 0.95)"),
    ({"type": "int", "low": 16, "high": 250, "step": 16},
     "step 16 from low 16 never reaches high 250 (allowed: high: 240 (the nearest below) or 256)"),
])
def test_a_step_that_misses_high_says_the_nearest_valid_high(cli: Cli, write_space: Callable[[dict], Path],
                                                             param: dict, message: str) -> None:
    data = copy.deepcopy(MINIMAL)
    data["params"]["--mem-fraction-static" if param["type"] == "float" else "--cuda-graph-max-bs"].update(param)
    data["baseline"] = None
    path = write_space(data)
    code, out, _ = cli("space", "check", str(path))
    assert code == 2
    assert message in out, out
