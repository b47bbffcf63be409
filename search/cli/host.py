"""`search host ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="host commands.", no_args_is_help=True)
