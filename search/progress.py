"""What a running study shows: trial n of N, its phase, best so far against the baseline, time, ETA.

On a terminal it is a rich live panel redrawn in place; otherwise (a log file, nohup, a test)
one plain line per event, so an overnight log reads top to bottom.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.live import Live
from rich.table import Table

from search.logwatch import Event
from search.loadtest import LevelResult
from search.results import outcome_text
from search.study import Listener, StudyRun


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class StudyProgress:
    """Follows a `StudyRun` through its `Listener` hooks; use as a context manager around `run()`."""

    def __init__(self, run: StudyRun, console: Console | None = None) -> None:
        self.run = run
        self.console = console or Console(highlight=False)
        self.began = time.monotonic()
        self.number: int | None = None
        self.tag = ""
        self.phase = ""
        self.durations: list[float] = []  # seconds per measured trial in this run, for the ETA
        self._trial_began = self.began
        self._live: Live | None = None
        run.listener = Listener(trial_started=self.trial_started, event=self.event, level=self.level,
                                trial_done=self.trial_done, note=self.note)

    def __enter__(self) -> StudyProgress:
        if self.console.is_terminal:
            self._live = Live(self._panel(), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._panel())
            self._live.__exit__(*exc)

    # -- hooks ------------------------------------------------------------------------------
    def trial_started(self, number: int, tag: str, config: Mapping[str, Any]) -> None:
        self.number, self.tag, self.phase = number, tag, "starting"
        self._trial_began = time.monotonic()
        self._say(f"trial {number} ({tag}) starting: " + " ".join(f"{k}={v}" for k, v in config.items()))

    def event(self, event: Event) -> None:
        if event.kind == "phase":
            self.phase = event.name
            self._refresh()

    def level(self, level: LevelResult) -> None:
        self.phase = f"load test: {level.output_throughput:,.0f} tok/s at {level.max_concurrency}"
        self._say(f"trial {self.number}: {self.phase}")

    def trial_done(self, trial: FrozenTrial) -> None:
        if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            self.durations.append(time.monotonic() - self._trial_began)
        value = f", {trial.value:,.0f} tok/s" if trial.value is not None else ""
        self.number, self.phase = None, ""
        self._say(f"trial {trial.number}: {outcome_text(trial)}{value}  |  {self._status()}")

    def note(self, text: str) -> None:
        self._say(text)

    # -- rendering --------------------------------------------------------------------------
    def _best(self) -> tuple[float | None, float | None]:
        """(best feasible value, baseline value) so far."""
        if self.run.study is None:
            return None, None
        done = self.run.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        ok = [t.value for t in done if t.value is not None and not any(v > 0 for v in (t.constraints or {}).values())]
        base = [t.value for t in done if t.user_attrs.get("strategy") == "baseline"]
        return (max(ok) if ok else None), (base[0] if base else None)

    def _eta(self) -> float | None:
        if not self.durations:
            return None
        eta = statistics.fmean(self.durations) * max(0, self.run.n_trials - self.run.measured())
        left = self.run.deadline_left()
        return eta if left is None else min(eta, left)

    def _status(self) -> str:
        best, base = self._best()
        vs = f" ({best / base - 1:+.0%} vs baseline {base:,.0f})" if best and base else ""
        return (f"measured {self.run.measured()}/{self.run.n_trials}, best {f'{best:,.0f} tok/s' if best else '-'}{vs}, "
                f"used {_clock(time.monotonic() - self.began)}, left {_clock(self.run.deadline_left())}, "
                f"ETA {_clock(self._eta())}")

    def _panel(self) -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_row("study", f"{self.run.name}  trial {self.run.measured() + 1} of {self.run.n_trials}")
        grid.add_row("now", f"trial {self.number} ({self.tag}): {self.phase}" if self.number is not None else "-")
        grid.add_row("status", self._status())
        return grid

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._panel())

    def _say(self, text: str) -> None:
        self.console.print(text, markup=False)
        self._refresh()
