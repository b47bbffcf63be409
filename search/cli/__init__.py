"""The ``search`` command: a thin typer front over the library, grouped by noun.

Each noun lives in its own module; this one only assembles them and maps errors to exit
codes (0 ok, 2 bad usage or input, 1 failed run) with a one-line message.
"""

from __future__ import annotations

import sys

import click
import typer

from search.errors import SearchError

app = typer.Typer(
    name="search",
    help="Overnight Bayesian configuration search for SGLang inference servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_debug = False


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    global _debug
    _debug = debug


def _register() -> None:
    # Imported here so that `search --help` stays cheap and each noun owns its module.
    from search.cli import bench, emulate, host, log, space, study, trial

    app.add_typer(space.app, name="space")
    app.add_typer(study.app, name="study")
    app.add_typer(trial.app, name="trial")
    app.add_typer(log.app, name="log")
    app.command("bench", help="Load-test a running SGLang server up a concurrency ladder.")(bench.bench)
    app.add_typer(host.app, name="host")
    app.command(
        "emulate",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        help="Run the SGLang-compatible emulator with SGLang's own flags (see `search emulate --help`).",
    )(emulate.emulate)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app, turn SearchError into a clean exit."""
    try:
        # Without standalone mode click hands back `typer.Exit(code)` as a return value instead of exiting.
        result = app(args=argv, standalone_mode=False)
        if isinstance(result, int) and not isinstance(result, bool):
            sys.exit(result)
    except SearchError as exc:
        if _debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    sys.exit(0)
