"""The values a stepped range can take, and the nearest valid ``high`` when a step misses it.

Optuna samples ``low, low + step, ...`` and never a ``high`` the step does not reach, so such a
space passes its check and later refuses its own declared ``high`` (a baseline at 0.9 of
``0.5..0.9 step 0.15``). The check names the nearest ends the step does reach instead.
"""

from __future__ import annotations

import math

_TOLERANCE = 1e-6  # in steps: float ranges such as 0.1..0.9 step 0.1 are not exact


def _snap(value: float, step: float) -> float:
    """``value`` at the step's decimals (0.8000000000000002 -> 0.8); ints stay ints."""
    if isinstance(step, int) and float(value).is_integer():
        return int(value)
    return round(value, max(0, -math.floor(math.log10(step)) + 3))


def reachable_highs(low: float, high: float, step: float) -> tuple[float, float] | None:
    """The grid ends just below and just above ``high`` when the step does not land on it; else None."""
    steps = (high - low) / step
    if abs(steps - round(steps)) < _TOLERANCE:
        return None
    return _snap(low + math.floor(steps) * step, step), _snap(low + math.ceil(steps) * step, step)
