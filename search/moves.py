"""The values the plan moves a parameter to, and what a ladder says of the running-batch cap.

Pure functions of one parameter's distribution (and, for the ladder reads, of trials' levels), with
no study in sight, so `search.plan`'s sources read as rules and each helper is tested alone:
representative values (`grid_values`), a screen's most different value (`screen_values`), numeric
neighbours (`neighbours`), what a crash's advice says to change and where that moves a value
(`advice`, `toward`), and the cap at which throughput peaks (`running_peak`, `running_kink`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial

from search.settings import DEFAULT
from search.storage import Attr

# SGLang's cap on the running batch: a ladder level runs min(concurrency, cap) requests at once.
CAP = "--max-running-requests"


def snap(dist: IntDistribution | FloatDistribution, x: float) -> Any:
    """``x`` as a value of the numeric ``dist``: inside its range, on its step, int or float."""
    x = min(max(x, dist.low), dist.high)
    if dist.step:
        x = min(dist.low + round((x - dist.low) / dist.step) * dist.step, dist.high)
    return int(round(x)) if isinstance(dist, IntDistribution) else float(round(x, 6))


def grid_values(dist: BaseDistribution, points: int) -> list[Any]:
    """Representative values of one parameter: all choices, or `points` spread over the range."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    low, high = dist.low, dist.high
    if points <= 1 or low == high:
        return [low]
    if dist.log:
        raw = [math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (points - 1)) for i in range(points)]
    else:
        raw = [low + (high - low) * i / (points - 1) for i in range(points)]
    values: list[Any] = []
    for x in raw:
        v = snap(dist, x)
        if v not in values:
            values.append(v)
    return values


def scale(dist: IntDistribution | FloatDistribution) -> Callable[[float], float]:
    """The scale a numeric parameter's distances are measured on: log if its range is log."""
    return math.log if dist.log else float


def unscale(dist: IntDistribution | FloatDistribution) -> Callable[[float], float]:
    """The inverse of `scale`."""
    return math.exp if dist.log else float


def neighbours(dist: BaseDistribution, value: Any, sweep_pass: int) -> list[Any]:
    """Numeric values either side of `value`, 1/2^(pass+1) of the range away (log scale if log)."""
    if isinstance(dist, CategoricalDistribution):
        return []
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    to, back = scale(dist), unscale(dist)
    width = (to(dist.high) - to(dist.low)) / 2 ** (sweep_pass + 1)
    out: list[Any] = []
    for y in (to(value) - width, to(value) + width):
        v = snap(dist, back(y))
        if v != value and v not in out:
            out.append(v)
    return out


def screen_values(dist: BaseDistribution, value: Any) -> list[Any]:
    """The one value of a parameter most different from `value` (empty if it has no other).

    A categorical's null choice (SGLang decides) or else its first listed one (space files list the
    default first), the last one if `value` is already first; a numeric range's farther bound (in
    log space when the range is log).
    """
    if isinstance(dist, CategoricalDistribution):
        choices = list(dist.choices)
        if None in choices and value is not None:
            return [None]
        other = choices[-1] if value == choices[0] else choices[0]
        return [other] if other != value else []
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    to = scale(dist)
    far = dist.high if abs(to(dist.high) - to(value)) >= abs(to(value) - to(dist.low)) else dist.low
    return [far] if far != value else []


def unordered(dist: BaseDistribution) -> bool:
    """A categorical whose choices have no order (backends, levels): one screen says little of the rest."""
    return isinstance(dist, CategoricalDistribution) and not all(
        c is None or isinstance(c, (int, float)) for c in dist.choices)


def named_in(text: str, dists: Mapping[str, BaseDistribution]) -> list[str]:
    """Parameters a failure line names: a flag given in full or by a prefix of it
    (``--cuda-graph-max-bs`` names ``--cuda-graph-max-bs-decode``), or an environment variable."""
    flags = re.findall(r"--[a-z0-9][a-z0-9-]*", text)
    return [n for n in dists
            if (n.startswith("--") and any(n == f or n.startswith(f + "-") for f in flags))
            or (not n.startswith("--") and re.search(rf"\b{re.escape(n)}\b", text))]


_DOWN = re.compile(r"\b(?:smaller|lower|decrease|reduce|less)\b", re.IGNORECASE)
_UP = re.compile(r"\b(?:larger|higher|increase|raise|bigger|more)\b", re.IGNORECASE)
_OFF = re.compile(r"\b(?:not using|without|remove|drop)\b", re.IGNORECASE)
# Clauses of advice: lines, sentences, and the items of a numbered list on one line.
_CLAUSE = re.compile(r"[;\n]|(?<=[.!?])\s+(?=[A-Z0-9])|\s(?=\d+\.\s)")


def _is_bool(dist: BaseDistribution) -> bool:
    return isinstance(dist, CategoricalDistribution) and set(dist.choices) == {False, True}


def advice(text: str, dists: Mapping[str, BaseDistribution]) -> dict[str, tuple[str, Any]]:
    """What a failure's text advises for each parameter it names, clause by clause.

    ``("down" | "up", None)`` for "set --mem-fraction-static to a smaller value" / "increase
    --mem-fraction-static"; ``("set", value)`` for a flag given with one of its choices
    (``--cuda-graph-backend-decode disabled``) or a store_true flag ("disable CUDA graph by
    --disable-cuda-graph" sets it, "by not using --enable-torch-compile" clears it);
    ``("any", None)`` where the clause says nothing of how to change it.
    """
    out: dict[str, tuple[str, Any]] = {}
    for clause in _CLAUSE.split(text):
        for name in named_in(clause, dists):
            dist = dists[name]
            given = re.search(rf"{re.escape(name)}(?:=|\s+)([\w.-]+)", clause)
            choices = {str(c): c for c in getattr(dist, "choices", ())}
            value = given.group(1).rstrip(".") if given else None  # "...=disabled. (Not recommended)"
            if value in choices and not _is_bool(dist):
                out[name] = ("set", choices[value])
            elif _is_bool(dist):
                out[name] = ("set", not _OFF.search(clause))
            elif _DOWN.search(clause):
                out[name] = ("down", None)
            elif _UP.search(clause):
                out[name] = ("up", None)
            else:
                out.setdefault(name, ("any", None))
    return out


def toward(dist: BaseDistribution, value: Any, hint: tuple[str, Any], points: int = DEFAULT.repair_points) -> Any | None:
    """The value a hint moves ``value`` to: the next grid value below / above it, the value it
    sets, or the screen's most different value; None when there is none.

    A categorical of numbers counts as ordered; its null choice (SGLang decides) moves to the
    smallest / largest number, the value most likely to fix what the advice is about.
    """
    how, target = hint
    if how == "set":
        return target if target != value and target in getattr(dist, "choices", (target,)) else None
    if how == "any":
        return (screen_values(dist, value) or [None])[0]
    if isinstance(dist, CategoricalDistribution):
        ordered = sorted(c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool))
    else:
        ordered = grid_values(dist, points)
    if not ordered:
        return None
    if not isinstance(value, (int, float)):
        return ordered[0] if how == "down" else ordered[-1]
    side = [v for v in ordered if (v < value if how == "down" else v > value)]
    return (side[-1] if how == "down" else side[0]) if side else None


def close_in(dist: BaseDistribution, a: Any, b: Any, within: float) -> bool:
    """Whether two values of a numeric parameter lie within ``within`` of its range (log scale if log)."""
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    to = scale(dist)
    return abs(to(a) - to(b)) <= within * (to(dist.high) - to(dist.low))


def cap_of(params: Mapping[str, Any]) -> float | None:
    """The config's running-batch cap; None where SGLang picks it (not searched, or null)."""
    cap = params.get(CAP)
    return float(cap) if isinstance(cap, (int, float)) and not isinstance(cap, bool) else None


def running_points(trials: Iterable[FrozenTrial]) -> list[tuple[float, float]]:
    """(running batch, mean tok/s) over the ladder levels of ``trials``: a level runs
    min(concurrency, the trial's cap) requests at once."""
    seen: dict[float, list[float]] = {}
    for t in trials:
        ladder, cap = t.user_attrs.get(Attr.LADDER) or [], cap_of(t.params)
        for step, value in t.intermediate_values.items():
            if step < len(ladder):
                running = float(ladder[step] if cap is None else min(ladder[step], cap))
                seen.setdefault(running, []).append(float(value))
    return sorted((r, sum(v) / len(v)) for r, v in seen.items())


def running_peak(points: Sequence[tuple[float, float]], noise: float = DEFAULT.noise_margin) -> float | None:
    """The running batch where throughput peaks, when the peak lies inside ``points`` and the curve
    falls beyond it by more than ``noise``: the vertex of a parabola through it and its neighbours (in
    log batch size), kept between them. None otherwise."""
    if len(points) < 3:
        return None
    i = max(range(len(points)), key=lambda j: points[j][1])
    if i in (0, len(points) - 1) or points[i][1] < points[i + 1][1] * (1.0 + noise):
        return None
    (x0, y0), (x1, y1), (x2, y2) = ((math.log(r), v) for r, v in points[i - 1:i + 2])
    den = (x0 - x1) * (x0 - x2) * (x1 - x2)  # the parabola through three unequally spaced points
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / den
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / den
    x = -b / (2 * a) if a < 0 else x1
    return math.exp(min(max(x, x0), x2))


def running_kink(points: Sequence[tuple[float, float]]) -> float | None:
    """Where the line through the two points rising to the highest one meets the line through the
    two points falling after it (log batch, log tok/s), when they meet between them; else None.

    A second, finer read of the peak once a capped run has put a point near it: throughput often
    rises with the batch until the KV cache runs short, then falls steeply, a kink that a parabola
    through three points places on the wrong side. Tried on both sides of the highest point.
    """
    if len(points) < 4:
        return None
    logs = [(math.log(r), math.log(v)) for r, v in points if v > 0]
    i = max(range(len(logs)), key=lambda j: logs[j][1])
    found = []
    for up, down in ((i - 1, i + 1), (i - 2, i)):  # the kink after the highest point, or before it
        if up < 0 or down + 1 >= len(logs):
            continue
        (a0, b0), (a1, b1) = logs[up], logs[up + 1]
        (c0, d0), (c1, d1) = logs[down], logs[down + 1]
        rise, fall = (b1 - b0) / (a1 - a0), (d1 - d0) / (c1 - c0)
        if rise <= fall:
            continue
        x = (d0 - b1 + rise * a1 - fall * c0) / (rise - fall)
        if a1 <= x <= c0:
            found.append(x)
    return math.exp(found[0]) if found else None


def nearest(dist: BaseDistribution, value: float) -> Any | None:
    """The value of ``dist`` closest to ``value`` (its step honoured; a categorical's numeric
    choices, closest in log scale), or None for a categorical without positive numbers."""
    if isinstance(dist, CategoricalDistribution):
        numbers = [c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0]
        return min(numbers, key=lambda c: abs(math.log(c) - math.log(value))) if numbers else None
    assert isinstance(dist, (IntDistribution, FloatDistribution))
    return snap(dist, value)
