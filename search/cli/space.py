"""`search space ...`: check a space (or a launch command) against SGLang's flags; render profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from search import manifests
from search.command import check_command
from search.errors import BadInput
from search.output import write_output
from search.overrides import overridden, parse_sets
from search.profile import render as render_profile
from search.profile import to_json, to_sglang_config, to_shell
from search.space import CheckReport, Space, SpaceError, load_space, read_space, salvage_space
from search.space_check import check_space

app = typer.Typer(help="Space files: check them against SGLang's flags, render launch profiles.", no_args_is_help=True)

_FORMATS = {"shell": to_shell, "sglang-config": to_sglang_config, "json": to_json}


def _manifest(version: str | None, python: str | None, default: str) -> manifests.Manifest:
    if version and python:
        raise BadInput("give --sglang-version or --python, not both")
    return manifests.live(python) if python else manifests.load(version or default)


@app.command("check")
def check(
    space_file: Optional[Path] = typer.Argument(None, metavar="SPACE", help="A space file (spaces/*.yaml)."),
    command: Optional[str] = typer.Option(None, "--command", help="Check this launch command instead of a space."),
    version: Optional[str] = typer.Option(None, "--sglang-version", help="Check against a shipped manifest "
                                          f"({', '.join(manifests.SHIPPED)}); default: the space's version."),
    python: Optional[str] = typer.Option(None, "--python", help="Check against the sglang installed for this Python."),
    gpus: Optional[int] = typer.Option(None, "--gpu-count", min=1, help="The host's GPU count: every parallel layout "
                                       "the space can sample must take a number of GPUs that divides it."),
) -> None:
    """Print every problem as `file: key: what is wrong (allowed: ...)`; exit 2 on any error."""
    if (space_file is None) == (command is None):
        raise BadInput("give a space file or --command \"python -m sglang.launch_server ...\", not both or neither")
    if command is not None:
        manifest = _manifest(version, python, manifests.DEFAULT_VERSION)
        _report("launch command", manifest, check_command(command, manifest))
        return
    assert space_file is not None  # exactly one of the two, checked above
    # Entries that break the schema are reported and left out; the rest still meets the manifest.
    try:
        data = read_space(space_file)
    except SpaceError as exc:  # the file itself (YAML, keys given twice): every line of it, then stop
        _print(CheckReport(exc.problems))
        raise BadInput(f"{space_file}: {len(exc.problems)} error(s) in the file itself; fix them to check the rest") from None
    space, schema_problems = salvage_space(data, str(space_file))
    manifest = _manifest(version, python, space.sglang_version)
    report = check_space(space, manifest, gpus)
    report.problems[:0] = schema_problems
    _report(str(space_file), manifest, report)


def checked_space(path: Path, host_gpus: int | None = None) -> Space:
    """The space at `path`, checked against its SGLang's shipped flags (and ``host_gpus``, the GPUs a host
    offers) before a run starts anything.

    Errors stop the run (exit 2, every problem on stderr); warnings are printed and the run goes on.
    A version without a shipped manifest is left to `search space check --python` on the target."""
    space = load_space(path)
    if space.sglang_version not in manifests.SHIPPED:
        typer.echo(f"warning: {path}: no shipped flag manifest for SGLang {space.sglang_version}, so not checked; "
                   f"run `search space check {path} --python PATH` with the target's Python", err=True)
        return space
    report = check_space(space, manifests.load(space.sglang_version), host_gpus)
    _print(report, err=True)
    if not report.ok:
        raise BadInput(f"{path}: {len(report.errors)} error(s) for SGLang {space.sglang_version}; nothing was "
                       f"started (`search space check {path}` checks it again)")
    return space


def _print(report: CheckReport, err: bool = False) -> None:
    for problem in report.errors:
        typer.echo(str(problem), err=err)
    for problem in report.warnings:
        typer.echo(f"warning: {problem}", err=err)


def _report(what: str, manifest: manifests.Manifest, report: CheckReport) -> None:
    _print(report)
    tally = f"for SGLang {manifest.version} ({len(report.warnings)} warning(s))"
    if not report.ok:
        raise BadInput(f"{what}: {len(report.errors)} error(s) {tally}")
    typer.echo(f"{what}: valid {tally}", err=True)


@app.command("render")
def render(
    space_file: Path = typer.Argument(..., metavar="SPACE", help="A space file (spaces/*.yaml)."),
    sets: list[str] = typer.Option([], "--set", help="PARAM=VALUE (YAML value: 64, 0.9, true, null); repeatable."),
    baseline: bool = typer.Option(False, "--baseline", help="Start from the space's baseline config."),
    fmt: str = typer.Option("shell", "--format", help="shell | sglang-config | json"),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write here instead of stdout."),
) -> None:
    """Render the fixed launch plus a config (params not given keep SGLang's defaults)."""
    if fmt not in _FORMATS:
        raise BadInput(f"unknown --format {fmt!r}; use one of {', '.join(_FORMATS)}")
    space = load_space(space_file)
    config = _config(space, sets, baseline)
    text = _FORMATS[fmt](render_profile(space, config))
    if output is None:
        typer.echo(text, nl=False)
        return
    write_output(output, text, executable=fmt == "shell")
    typer.echo(f"wrote {output}", err=True)


def _config(space: Space, sets: list[str], baseline: bool) -> dict[str, Any]:
    if baseline and space.baseline is None:
        raise BadInput(f"{space.source} has no baseline; drop --baseline or add one")
    return overridden(space, (space.baseline or {}) if baseline else {}, parse_sets(sets, space))
