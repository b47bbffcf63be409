"""`search space ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="space commands.", no_args_is_help=True)
