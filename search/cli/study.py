"""`search study ...` commands."""

from __future__ import annotations

import typer

app = typer.Typer(help="study commands.", no_args_is_help=True)
