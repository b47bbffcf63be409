"""The parallel layouts a space can sample, checked before the night: SGLang's rules and the host's GPUs.

A space may search `--tp-size`, `--dp-size`, `--enable-dp-attention`, `--attn-dp-size`, `--ep-size`
and `--pp-size` like any flag, but not every combination starts (`search.layout` has SGLang's rules,
with their sources), and a layout that takes more GPUs than the host has, or a count that does not
divide it, wastes the night. So `search space check` walks every combination of the layout params'
values reachable under their `when` conditions (the other params at the baseline) and reports each
bad one with the fix: a `when:` condition that excludes it, or a value dropped.
"""

from __future__ import annotations

import itertools
from typing import Any

from search.errors import BadInput
from search.layout import LAYOUT_FLAGS, Layout
from search.profile import render
from search.space import BoolParam, CategoricalParam, IntParam, Problem, Space

MAX_COMBINATIONS = 4096  # beyond this a space's layouts are sampled, not walked (a huge int range)
_FIX = "a `when:` condition on the param that excludes it, or drop the value"


def _values(param: Any) -> list[Any] | None:
    """Every value a layout param takes; None for one too wide to walk."""
    if isinstance(param, BoolParam):
        return [False, True]
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    if isinstance(param, IntParam) and not param.log:
        values = list(range(param.low, param.high + 1, param.step or 1))
        return values if len(values) <= 64 else None
    return None


def layout_problems(space: Space, host_gpus: int | None = None) -> list[Problem]:
    """Each distinct layout the space can start that SGLang refuses or the host cannot hold, once."""
    walked = {name: values for name in space.params if name in LAYOUT_FLAGS
              if (values := _values(space.params[name])) is not None}
    names = list(walked)
    base = dict(space.baseline or {})
    seen: set[tuple[tuple[str, Any], ...]] = set()
    out: list[Problem] = []
    reported: set[str] = set()
    for combo in itertools.islice(itertools.product(*walked.values()), MAX_COMBINATIONS):
        config = space.active({**base, **dict(zip(names, combo, strict=True))})
        key = tuple((n, config[n]) for n in names if n in config)
        if key in seen:
            continue
        seen.add(key)
        try:
            layout = Layout.of(render(space, config).args)
        except BadInput:  # the space's own problems are reported by the rest of the check
            continue
        for message in layout.problems(host_gpus):
            where = " ".join(f"{n}={v}" for n, v in key) or "baseline"
            if message not in reported:
                reported.add(message)
                out.append(space._problem(f"params: {where}" if key else "baseline", message,
                                          _FIX if key else None))
    return out
