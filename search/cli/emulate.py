"""`search emulate [SGLang flags]`: the emulator under our CLI, same as `python -m search.emulator`."""

from __future__ import annotations

import typer


def emulate(ctx: typer.Context) -> None:
    from search.emulator.__main__ import main

    raise typer.Exit(main(list(ctx.args)))
