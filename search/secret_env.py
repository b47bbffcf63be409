"""Secrets a space names but this shell does not set: one rule for every host.

Spaces name ``HF_TOKEN`` by default, though only a gated model needs it. A local host started the
server without it while an SSH host stopped the study, so the demo space could not run over SSH
without a token it does not need. Every host now starts the server with the secrets that are set
and says once per run which are not, so that a gated model's download error can be traced to it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

_log = logging.getLogger(__name__)
_warned: set[str] = set()  # names already reported by this process


def set_secrets(names: Iterable[str]) -> list[str]:
    """The names among ``names`` that this environment sets; each unset one is warned about once."""
    names = list(names)
    for name in names:
        if name not in os.environ and name not in _warned:
            _warned.add(name)
            _log.warning("warning: secret %s named by the space is not set here; servers start without it "
                         "(a public model needs none; export it for a gated one)", name)
    return [name for name in names if name in os.environ]
