"""`search bench URL`: load-test a running SGLang server up a concurrency ladder."""

from __future__ import annotations

import typer


def bench(url: str = typer.Argument(..., help="Base URL of the server, e.g. http://127.0.0.1:30000")) -> None:
    """Load-test a running server (filled in by the load-test module)."""
    raise typer.Exit(1)
