"""`study run` writes no library warnings to stderr: its errors stay one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import write_space


def test_study_run_prints_no_optuna_experimental_warning(workdir: Path) -> None:
    space = write_space(workdir)
    done = subprocess.run([sys.executable, "-c", "from search.cli import main; main()", "study", "run", str(space),
                           "--study", "q", "--emulate", "--n-trials", "1", "--remeasure", "0"],
                          cwd=workdir, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr
