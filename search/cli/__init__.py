"""The ``search`` command: a thin typer front over the library, grouped by noun.

Each noun lives in its own module; this one only assembles them and maps errors to exit
codes (0 ok, 2 bad usage or input, 1 failed run) with a one-line message.
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from typing import Any, NoReturn

import optuna
import typer

from search.errors import SearchError

# The exceptions of the click that typer runs on: the `click` package for older typer, the copy
# newer typer bundles (`typer._click`) otherwise; `typer.BadParameter` is that click's own class.
_click_errors = importlib.import_module(typer.BadParameter.__module__)
# click >= 8.2 raises this for a bare group (older click prints the help and exits 0 itself).
_NO_ARGS: Any = getattr(_click_errors, "NoArgsIsHelpError", ())

app = typer.Typer(
    name="search",
    help="Overnight Bayesian configuration search for SGLang inference servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_debug = False

# Optuna warns about the experimental options `search` chose on purpose (TPE's `group`); not the user's
# concern, and they would break the one-line promise of every message before an error.
warnings.filterwarnings("ignore", message=r".*experimental.*interface can change")


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    global _debug
    _debug = debug
    # The program, not the library, owns the process's logging: Optuna's INFO line per study is noise here.
    optuna.logging.set_verbosity(optuna.logging.WARNING)


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
    """Console entry point: run the app; every error a user can cause ends as one stderr line."""
    global _debug
    _debug = False  # set by the root callback; not left over from an earlier in-process call
    try:
        # Without standalone mode click hands back `typer.Exit(code)` as a return value instead of exiting.
        result = app(args=argv, prog_name="search", standalone_mode=False)
        if isinstance(result, int) and not isinstance(result, bool):
            sys.exit(result)
    except SearchError as exc:
        if _debug:
            raise
        _fail(str(exc), exc.exit_code)
    except _click_errors.UsageError as exc:
        _usage_error(exc)
    except _click_errors.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except typer.Abort:
        _fail("aborted", 130)
    except Exception as exc:  # a bug: one line unless --debug asks for the traceback
        if _debug:
            raise
        _fail(f"{type(exc).__name__}: {exc} (a bug in search; rerun with --debug for the traceback)", 1)
    sys.exit(0)


def _fail(message: str, code: int) -> NoReturn:
    print(f"error: {' '.join(message.strip().splitlines())}", file=sys.stderr)
    sys.exit(code)


def _usage_error(exc: Any) -> NoReturn:
    """`error: no such option: --bogus (see search space check --help)`, exit 2; a bare group shows its help."""
    ctx = exc.ctx
    if isinstance(exc, _NO_ARGS):
        if exc.format_message().strip():  # rich-less help comes back as text; rich help was printed already
            print(exc.format_message())
        _fail(f"{ctx.command_path} needs a command: {', '.join(ctx.command.list_commands(ctx))}", 2)
    message = re.sub(r"\.$", "", exc.format_message().strip())
    see = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    _fail(message[:1].lower() + message[1:] + see, 2)
