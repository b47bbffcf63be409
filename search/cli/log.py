"""`search log ...`: classify a saved SGLang log, or watch a live one phase by phase."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path

import typer

from search.errors import BadInput, RunFailed
from search.logwatch import PHASES, LogClassifier, describe, follow, read_log
from search.shell_words import one_line

app = typer.Typer(help="Read SGLang server logs: phase reached, loading progress, failure.", no_args_is_help=True)

# After the first failure line, keep reading this long: the traceback's more telling lines
# (the exception itself) are usually flushed just after "Scheduler hit an exception".
_SETTLE_S = 0.5


@app.command("classify")
def classify(
    file: Path = typer.Argument(..., help="A saved SGLang server log."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
    version: str = typer.Option(None, "--sglang-version", help="Only this version's wording (default: all)."),
) -> None:
    """Report the last phase reached, the failure (if any) with its deciding line, and loading %.

    Exits 0 whether or not a failure was found: the verdict is the output.
    """
    if file.is_dir():
        raise BadInput(f"{file} is a directory; give a server log file in it (e.g. {file / 'server.log'})")
    classifier = read_log(file, version)
    if as_json:
        typer.echo(json.dumps(classifier.summary()))  # escapes control characters itself
    else:
        typer.echo(one_line(_one_line(classifier)))  # a log's escape sequences never reach the terminal


def _one_line(classifier: LogClassifier) -> str:
    if classifier.failure is not None:
        return describe(classifier.failure)
    if classifier.phase is None:
        return "empty log: no SGLang output"
    verdict = classifier.summary()
    progress = f" (loading {verdict['progress']:.0f}%)" if verdict["progress"] is not None else ""
    state = "ready" if verdict["phase"] == "ready" else f"reached {verdict['phase']}, no failure"
    return f"{state}{progress}: {verdict['line']}"


@app.command("watch")
def watch(
    file: Path = typer.Argument(..., help="The log of a starting SGLang server (may not exist yet)."),
    timeout_s: float = typer.Option(1800.0, "--timeout-s", help="Stall when no new line for this long (s)."),
    version: str = typer.Option(None, "--sglang-version", help="Only this version's wording (default: all)."),
) -> None:
    """Follow a live log and print each phase as it begins; end at ready (exit 0) or a failure (exit 1)."""
    if timeout_s <= 0:
        raise BadInput(f"--timeout-s {timeout_s:g} must be positive: give the longest silence to allow")
    classifier = LogClassifier(version)
    done = threading.Event()
    settle_until: float | None = None
    shown_pct = -10.0

    def stop() -> bool:
        now = time.time()
        if settle_until is not None and now >= settle_until:
            return True
        if classifier.check_stall(now, dict.fromkeys(PHASES, timeout_s)):
            return True
        return done.is_set()

    for line in follow(file, stop):
        for event in classifier.feed(line):
            if event.kind == "phase":
                typer.echo(f"{_clock(event.time)}  {event.name}")
            elif event.kind == "progress" and event.progress is not None and event.progress >= shown_pct + 10:
                shown_pct = event.progress
                typer.echo(f"{_clock(event.time)}  loading {event.progress:.0f}%")
            elif event.kind == "failure" and settle_until is None:
                settle_until = time.time() + _SETTLE_S
        if classifier.phase == "ready" and classifier.failure is None:
            done.set()
    if not file.is_file():
        raise BadInput(f"no log file at {file} after {timeout_s:g} s; check the path (the server writes it as it starts)")
    if classifier.failure is not None:
        typer.echo(f"{_clock(classifier.failure.time)}  {one_line(describe(classifier.failure))}")
        raise RunFailed(f"server in {file} failed: {classifier.failure.name} at {classifier.failure.phase}")


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]
