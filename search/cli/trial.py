"""`search trial ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="trial commands.", no_args_is_help=True)
