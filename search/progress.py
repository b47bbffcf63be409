"""What a running study shows: every running trial with its host and phase, best so far against the
baseline, time, ETA.

On a terminal it is a rich live panel redrawn in place; otherwise (a log file, nohup, a test)
one plain line per event, so an overnight log reads top to bottom: a trial starting, the host it
was placed on with what it changes from the baseline, each level, its outcome.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.live import Live
from rich.table import Table

from search.loadtest import LevelResult
from search.logwatch import Event
from search.results import changed, outcome_text
from search.storage import TrialView, baseline
from search.study import Listener, StudyRun


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@dataclass
class _Now:
    """A running trial as the panel shows it."""

    tag: str
    began: float
    config: Mapping[str, Any]
    host: str = ""
    phase: str = "starting"


class StudyProgress:
    """Follows a `StudyRun` through its `Listener` hooks; use as a context manager around `run()`."""

    def __init__(self, run: StudyRun, console: Console | None = None) -> None:
        self.run = run
        self.console = console or Console(highlight=False)
        self.began = time.monotonic()
        self.running: dict[int, _Now] = {}  # by trial number
        self.durations: list[float] = []  # seconds per measured trial in this run, for the ETA
        self.width = 1  # most trials seen running at once: the ETA divides by it
        self._live: Live | None = None
        run.listener = Listener(trial_started=self.trial_started, placed=self.placed, event=self.event,
                                level=self.level, trial_done=self.trial_done, note=self.note)

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
        self.running[number] = _Now(tag, time.monotonic(), config)
        self.width = max(self.width, len(self.running))
        self._say(f"trial {number} ({tag}) starting: " + " ".join(f"{k}={v}" for k, v in config.items()))

    def placed(self, number: int, host: str) -> None:
        now = self.running.get(number)
        if now is not None:
            now.host = host
            changes = changed(dict(now.config), dict(self.run.space.baseline or {}))
            self._say(f"trial {number} ({now.tag}) on {host}" + (f": {changes}" if changes else ""))

    def event(self, number: int, event: Event) -> None:
        if event.kind == "phase" and number in self.running:
            self.running[number].phase = event.name
            self._refresh()

    def level(self, number: int, level: LevelResult) -> None:
        phase = f"load test: {level.output_throughput:,.0f} tok/s at {level.max_concurrency}"
        if number in self.running:
            self.running[number].phase = phase
        self._say(f"trial {number}: {phase}")

    def trial_done(self, trial: FrozenTrial) -> None:
        now = self.running.pop(trial.number, None)
        if now is not None and trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
            self.durations.append(time.monotonic() - now.began)
        value = f", {trial.value:,.0f} tok/s" if trial.value is not None else ""
        where = f" on {now.host}" if now is not None and now.host else ""
        self._say(f"trial {trial.number}{where}: {outcome_text(TrialView(trial))}{value}  |  {self._status()}")

    def note(self, text: str) -> None:
        self._say(text)

    # -- rendering --------------------------------------------------------------------------

    def _best(self) -> str:
        """The winner so far as every view names it (`search.ranking`), against the baseline."""
        best = self.run.best()
        if best is None or best.mean is None:
            return "-"
        base = baseline(self.run.study) if self.run.study is not None else None
        vs = f" ({best.mean / base.value - 1:+.0%} vs baseline {base.value:,.0f})" if base and base.value else ""
        return f"trial {best.number} {best.mean:,.0f} tok/s{vs}"

    def _eta(self) -> float | None:
        if not self.durations:
            return None
        eta = statistics.fmean(self.durations) * max(0, self.run.n_trials - self.run.measured()) / self.width
        left = self.run.deadline_left()
        return eta if left is None else min(eta, left)

    def _status(self) -> str:
        return (f"measured {self.run.measured()}/{self.run.n_trials}, best {self._best()}, "
                f"used {_clock(time.monotonic() - self.began)}, left {_clock(self.run.deadline_left())}, "
                f"ETA {_clock(self._eta())}")

    def _panel(self) -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_row("study", f"{self.run.name}  measured {self.run.measured()} of {self.run.n_trials}")
        for number, now in sorted(self.running.items()):
            where = f" on {now.host}" if now.host else ""
            grid.add_row("now", f"trial {number} ({now.tag}){where}: {now.phase}  {_clock(time.monotonic() - now.began)}")
        if not self.running:
            grid.add_row("now", "-")
        grid.add_row("status", self._status())
        return grid

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._panel())

    def _say(self, text: str) -> None:
        self.console.print(text, markup=False)
        self._refresh()
