"""``--set PARAM=VALUE``: one rule for `space render` and `trial run`.

An override changes the baseline; a baseline param that the change switches off goes with it
(``--set --cuda-graph-backend-decode=disabled`` drops the baseline's decode graph batch size,
which only applies to captured graphs), since the user never asked for it. A param the user sets
while its own condition fails is an error: what was asked for cannot run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from search.errors import BadInput
from search.space import Space


def parse_sets(items: Iterable[str], space: Space) -> dict[str, Any]:
    """``["--max-running-requests=256", "NCCL_MIN_NCHANNELS="]`` -> {name: value} (YAML scalars; empty = null)."""
    overrides: dict[str, Any] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise BadInput(f"--set {item!r}: write PARAM=VALUE, e.g. --set --max-running-requests=256")
        if name not in space.params:
            raise BadInput(f"--set {name}: not a parameter of the space; use one of {', '.join(space.params) or '(none)'}")
        overrides[name] = yaml.safe_load(raw) if raw.strip() else None
    return overrides


def overridden(space: Space, base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides``, less the base params they switch off; BadInput for a value outside its
    param or an override whose condition fails."""
    config = space.active({**base, **overrides})
    asked = {**config, **overrides}
    if problems := space.config_problems(asked, "--set", complete=False):
        raise BadInput("; ".join(map(str, problems)))
    return config
