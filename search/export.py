"""Take a trial home: its launch profile as a shell script, an SGLang ``--config`` YAML or JSON.

The default trial is the winner of `search.ranking` (re-measured mean first), as every view names it. The profile is
rendered from the space stored on the study and the trial's parameters, so it needs neither the
space file nor the trial's artifacts.
"""

from __future__ import annotations

import re
from pathlib import Path

import optuna

from search import results
from search.errors import BadInput
from search.output import write_output
from search.profile import LaunchProfile, render, to_json, to_sglang_config, to_shell
from search.storage import space_of, view

FORMATS = {"shell": ("sh", to_shell), "sglang-config": ("yaml", to_sglang_config), "json": ("json", to_json)}
DEFAULT_DIR = Path("profiles")


def profile(study: optuna.Study, number: int | None = None) -> tuple[int, LaunchProfile]:
    """The trial (given, or the best) and its launch profile."""
    chosen = results.best(study) if number is None else view(study, number)
    if not chosen.params and chosen.state != optuna.trial.TrialState.COMPLETE:
        raise BadInput(f"trial {chosen.number} of {study.study_name!r} has no parameters recorded; pick another --trial")
    space = space_of(study)
    return chosen.number, render(space, space.clean(chosen.params))


def describe(study: optuna.Study, number: int | None = None) -> str:
    """What the exported trial scored, naming the objective and its unit: ``trial 3: 12.50 req/s, max rate under slo``."""
    chosen = results.best(study) if number is None else view(study, number)
    objective = space_of(study).objective
    value = "no score" if chosen.value is None else objective.format(chosen.value)
    return f"trial {chosen.number}: {value}, {objective.name} ({objective.unit})"


def export(study: optuna.Study, fmt: str, *, number: int | None = None, out: Path | None = None) -> Path:
    """Write the profile in ``fmt``; the default file is ``profiles/<study>-trial<N>.<ext>``."""
    if fmt not in FORMATS:
        raise BadInput(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    ext, write = FORMATS[fmt]
    chosen, prof = profile(study, number)
    if out is None:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", study.study_name)
        out = DEFAULT_DIR / f"{safe}-trial{chosen}.{ext}"
    return write_output(out, write(prof), executable=fmt == "shell")
