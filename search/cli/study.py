"""`search study run | list | show | export | report`: the overnight search and the views on it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:
    from typer._click import Context

    from search.runner import Runner

app = typer.Typer(help="Run a configuration search and look at its results.", no_args_is_help=True)

_STORAGE = typer.Option("sqlite:///studies.db", "--storage", help="Optuna storage URL (SQLite or PostgreSQL).")


def bare_ray(args: list[str]) -> list[str]:
    """``--ray`` with no address (last, before another option, or before the space file) as ``--ray auto``.

    typer's bundled click has no option whose value may be left out, so the command line is
    completed before it is parsed; a Ray address never names an existing file.
    """
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--ray":
            following = args[i + 1] if i + 1 < len(args) else None
            if following is None or following.startswith("-") or Path(following).is_file():
                return [*args[: i + 1], "auto", *args[i + 1 :]]
    return args


class _RunCommand(TyperCommand):
    """`search study run`, whose ``--ray`` may come without an address (then ``auto``)."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, bare_ray(args))


@app.command("run", cls=_RunCommand)
def run(
    space_path: Path = typer.Argument(..., metavar="SPACE", help="Space file (spaces/X.yaml)."),
    study: str = typer.Option(..., "--study", help="Study name; running the same name again resumes it."),
    n_trials: int = typer.Option(40, "--n-trials", min=1, help="Measured trials the study should hold."),
    timeout: Optional[str] = typer.Option(None, "--timeout", help="Wall-clock budget for this run, e.g. 8h, 90m."),
    storage: str = _STORAGE,
    sampler: str = typer.Option("tpe", "--sampler", help="tpe | gp | random | grid."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampler seed."),
    emulate: bool = typer.Option(False, "--emulate", help="Run every trial on the local SGLang emulator."),
    start_from: list[str] = typer.Option([], "--start-from", metavar="COMMAND",
                                         help="Your own launch command: parsed into a config and tried early."),
    from_study: list[str] = typer.Option([], "--from-study", metavar="NAME",
                                         help="Try another study's best configs early."),
    hosts_file: Optional[Path] = typer.Option(None, "--hosts", help="hosts.yaml: run trials on its hosts, in turn."),
    host_name: Optional[str] = typer.Option(None, "--host", help="Only this host of --hosts (default: all of them)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", metavar="0,1,...",
                                       help="GPUs of this machine to share out: trials run side by side, each on "
                                            "as many as its layout takes (default: one trial at a time)."),
    ray_address: Optional[str] = typer.Option(None, "--ray", metavar="[ADDRESS|auto]",
                                              help="Run trials on a Ray cluster, one per GPU host; no address "
                                                   "means auto, the cluster this machine belongs to (docs/ray.md)."),
    remeasure: int = typer.Option(2, "--remeasure", min=0, help="Repeats for each of the top 3 configs at the end."),
    trials_dir: Path = typer.Option(Path("trials"), "--trials-dir", help="Where trial artifacts are written."),
) -> None:
    """Search SPACE: the baseline first, then the strategy's sweep and sampler; prune early, retry
    host faults, re-measure the top 3 at the end. Ctrl-C stops cleanly; run again to continue."""
    from search.cli.space import checked_space
    from search.errors import BadInput
    from search.loadtest.spec import parse_duration
    from search.progress import StudyProgress
    from search.storage import load
    from search.strategy import SAMPLERS
    from search.study import Interrupted, StudyRun, known_configs

    if sampler not in SAMPLERS:
        raise BadInput(f"--sampler {sampler!r}: choose one of {', '.join(SAMPLERS)}")
    offered = parse_gpus(gpus) if gpus is not None else None
    space = checked_space(space_path, len(offered) if offered else None)
    known = known_configs(space, start_from, [load(name, storage) for name in from_study])
    if space.baseline is None:
        if not known:
            raise BadInput(f"{space_path}: no baseline; add `baseline:` to the space or pass --start-from "
                           "with your current launch command")
        space = space.model_copy(update={"baseline": known.pop(0)})
    runner = _runner(emulate, hosts_file, host_name, ray_address, offered)
    driver = StudyRun(space=space, name=study, storage=storage, sampler=sampler, seed=seed, n_trials=n_trials,
                      timeout_s=parse_duration(timeout, "--timeout") if timeout else None, known=known,
                      remeasure=remeasure, trials_dir=trials_dir, runner=runner)
    try:
        with StudyProgress(driver):
            driver.run()
    except Interrupted as exc:
        print(f"interrupted: {exc}", file=sys.stderr)
        sys.exit(130)  # the shell's convention for SIGINT
    finally:
        runner.close()
    print(f"study {study} done; see `search study show {study}` and `search study export {study} --format shell`")


def parse_gpus(text: str) -> list[int]:
    """``--gpus 0,1,2,3`` as a list; a one-line BadInput naming the option otherwise."""
    from search.errors import BadInput

    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
        raise BadInput(f"--gpus {text!r}: give distinct GPU indexes separated by commas, e.g. --gpus 0,1,2,3")
    return [int(part) for part in parts]


def _runner(emulate: bool, hosts_file: Path | None, name: str | None, ray_address: str | None,
            gpus: list[int] | None = None) -> Runner:
    """Where trials run: in this process on one host or the hosts file's (side by side on hosts that offer
    a ``gpus`` list, else one at a time), or on every GPU host of a Ray cluster."""
    from search.errors import BadInput
    from search.hosts import local_host
    from search.slot_runner import pool_runner

    if ray_address is not None:
        if hosts_file is not None or name is not None or gpus is not None:
            raise BadInput(f"--ray {ray_address} runs each trial on a Ray node's own machine; leave out "
                           "--hosts/--host/--gpus (a node's GPUs are its SEARCH_HOST_GPUS)")
        from search.parallel import RayRunner

        return RayRunner(ray_address, emulate=emulate)
    if hosts_file is None:
        if name is not None:
            raise BadInput("--host needs --hosts FILE")
        return pool_runner([local_host(emulate=emulate, gpus=gpus)])
    if gpus is not None:
        raise BadInput("--gpus shares out this machine's GPUs; with --hosts, give each host its `gpus:` list there")
    if emulate:
        raise BadInput("--emulate runs trials locally; leave out --hosts (or set emulate: true on the host)")
    from search.hosts.config import load_hosts
    from search.hosts.ssh import SSHHost

    config = load_hosts(hosts_file)
    hosts = {entry.name: SSHHost(entry) for entry in config.hosts}  # each connects on first use
    pool = [hosts[config.get(name).name]] if name else list(hosts.values())
    return pool_runner(pool, hosts)  # every host by name: a dead run's trials are cleaned up where they ran


@app.command("list")
def list_studies(storage: str = _STORAGE) -> None:
    """Every study in the storage: trials, its winner (as `study show` names it), when it started."""
    import optuna

    from search.results import ranking
    from search.storage import StudyAttr, open_storage, views

    opened = open_storage(storage, create=False)
    summaries = optuna.get_all_study_summaries(opened, include_best_trial=False)
    if not summaries:
        print(f"no studies in {storage}; start one with `search study run SPACE --study NAME`")
        return
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=opened)
        won = ranking(study).best(views(study)) if StudyAttr.SPACE in study.user_attrs else None
        best = f"best {won.mean:,.0f} tok/s (trial {won.number})" if won and won.mean else "no result yet"
        began = s.datetime_start.strftime("%Y-%m-%d %H:%M") if s.datetime_start else "-"
        print(f"{s.study_name}\t{s.n_trials} trials\t{best}\tstarted {began}")


@app.command("show")
def show(
    name: str = typer.Argument(..., metavar="NAME"),
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Only the N best trials."),
    fmt: str = typer.Option("table", "--format", help="table | csv | json."),
    storage: str = _STORAGE,
) -> None:
    """The ranked trials, counts by outcome, gain over the baseline, GPU time, importances."""
    from search.results import render
    from search.storage import load

    sys.stdout.write(render(load(name, storage), fmt, top))


@app.command("export")
def export(
    name: str = typer.Argument(..., metavar="NAME"),
    fmt: str = typer.Option(..., "--format", help="shell | sglang-config | json."),
    trial: Optional[int] = typer.Option(None, "--trial", help="This trial instead of the best (re-measured) one."),
    out: Optional[Path] = typer.Option(None, "-o", "--output", help="File to write (default: profiles/...)."),
    storage: str = _STORAGE,
) -> None:
    """Write the launch profile of the best trial (or --trial N)."""
    from search.export import describe
    from search.export import export as write
    from search.storage import load

    study = load(name, storage)
    print(write(study, fmt, number=trial, out=out))
    print(describe(study, trial), file=sys.stderr)  # stdout stays the path, for scripts


@app.command("report")
def report(
    name: str = typer.Argument(..., metavar="NAME"),
    out: Optional[Path] = typer.Option(None, "-o", "--output", help="HTML file to write (default: report-NAME.html)."),
    storage: str = _STORAGE,
) -> None:
    """Write one self-contained HTML page on the study (opens offline).

    The winner against the baseline, history, per-level and latency charts, importances, what
    crashed where, startup phases, GPU power and time (docs/report.md)."""
    import re

    from search.report import write
    from search.storage import load

    default = Path(f"report-{re.sub(r'[^A-Za-z0-9_.-]+', '-', name)}.html")
    print(write(load(name, storage), out or default, storage))
