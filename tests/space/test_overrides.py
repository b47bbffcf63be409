"""`--set` means the same to `space render` and `trial run`: a baseline param the override switches
off is dropped; an override whose own condition fails, or a value outside its param, is refused."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tests.space.conftest import SPACES

DEMO = str(SPACES / "demo.yaml")
Cli = Callable[..., tuple[int, str, str]]


def test_render_drops_the_baseline_param_an_override_switches_off(cli: Cli) -> None:
    code, out, err = cli("space", "render", DEMO, "--baseline", "--set", "--cuda-graph-backend-decode=disabled")
    assert code == 0, err
    assert "--cuda-graph-backend-decode disabled" in out and "--cuda-graph-max-bs-decode" not in out


def test_an_override_whose_condition_fails_is_refused_by_both(cli: Cli, tmp_path) -> None:
    sets = ["--set", "--cuda-graph-backend-decode=disabled", "--set", "--cuda-graph-max-bs-decode=128"]
    line = ("error: spaces/demo.yaml: --set.--cuda-graph-max-bs-decode: set although its condition fails "
            "(allowed: only when --cuda-graph-backend-decode=full)")
    code, _, err = cli("space", "render", DEMO, "--baseline", *sets)
    assert code == 2 and err.splitlines() == [line.replace("spaces/", f"{SPACES}/")]
    done = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", "trial", "run", DEMO,
                           "--emulate", *sets], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == line.replace("spaces/", f"{SPACES}/")
    assert not (tmp_path / "trials").exists()  # nothing started


def test_trial_run_refuses_a_value_outside_the_param(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", "trial", "run", DEMO,
                           "--emulate", "--set", "--mem-fraction-static=1.5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--set.--mem-fraction-static: 1.5 is outside the param" in done.stderr
    assert not (tmp_path / "trials").exists()
