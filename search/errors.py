"""User-facing errors.

Every failure a user can cause or meet is one of these; the CLI prints its message as one
line and exits with its code. Anything else is a bug and shows a traceback under ``--debug``.
"""

from __future__ import annotations


class SearchError(Exception):
    """Base class: a one-line message that names the thing and what to do."""

    exit_code = 1


class BadInput(SearchError):
    """The user's input is wrong (space file, flag, option, URL): exit code 2."""

    exit_code = 2


class RunFailed(SearchError):
    """A run could not complete (server died, study aborted): exit code 1."""

    exit_code = 1


class InfrastructureFault(RunFailed):
    """Not the config's fault: port busy, GPUs still held, host unreachable, driver killed.

    The study retries the same parameters instead of blaming the config.
    """
