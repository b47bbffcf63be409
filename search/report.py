"""`search study report`: one self-contained HTML page that says what won, why, and what to avoid.

The page is built from the per-trial user attributes of docs/architecture.md and from the
`search.results` views (ranking, gain, GPU time, importances), so it never disagrees with
`search study show` or with what `search study export` writes. plotly.js is embedded once in the
page head: the file opens on a machine with no network, and each chart's div carries
``data-chart=<key>`` so a reader (or a test) can find every chart.

Every trial is named ``#N`` (its Optuna number) and keeps one colour in every chart: the
baseline slate, the top configs their own colours, every other trial its outcome's colour.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

import optuna
import plotly.graph_objects as go
from optuna.trial import TrialState
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from search import results
from search.errors import BadInput
from search.loadtest.metrics import level_at
from search.logwatch import PHASES
from search.output import write_output
from search.space import Space
from search.storage import DEFAULT_STORAGE, Outcome, Plan, StudyAttr, TrialView, space_of, view, views

TOP = 3  # configs drawn beside the baseline in the per-level charts
TABLE_ROWS = 12  # rows of the ranking table
MAX_VALUES = 6  # distinct float values shown as-is in the outcome map; more are binned

OUTCOME_COLOURS = {
    "completed": "#2563eb",
    "slo breached": "#f59e0b",
    "pruned": "#94a3b8",
    "crashed": "#dc2626",
    "infrastructure": "#7c3aed",
}
BASELINE_COLOUR = "#334155"
REMEASURE_COLOUR = "#0f766e"  # GPU time of the end-of-study re-measurement runs
TOP_COLOURS = ("#16a34a", "#0891b2", "#db2777")  # best, second, third
PHASE_LABELS = {"starting": "start", "loading": "weights", "kv_cache": "KV cache", "autotune": "autotune",
                "cuda_graph": "graph capture", "warmup": "warmup", "ready": "ready", "load_test": "load test"}
PHASE_COLOURS = {"starting": "#cbd5e1", "loading": "#3b82f6", "kv_cache": "#06b6d4", "autotune": "#f59e0b",
                 "cuda_graph": "#8b5cf6", "warmup": "#10b981"}
_FONT = "Inter, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif"
_PLOT_CONFIG = {"displaylogo": False, "responsive": True, "displayModeBar": False}


@dataclass(frozen=True)
class Section:
    """One chart of the page: its figure, or why there is none yet."""

    key: str
    title: str
    caption: str
    figure: go.Figure | None
    missing: str = ""


# --------------------------------------------------------------------------- trial facts


def _finished(study: optuna.Study) -> list[TrialView]:
    """Trials that ran (not skipped, not still running), in number order."""
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return [t for t in views(study, done) if t.skipped is None]


def _outcome(t: TrialView) -> str:
    """The outcome colour key: completed trials that broke a constraint are ``slo breached``."""
    outcome = t.outcome or (Outcome.INFRASTRUCTURE if t.state == TrialState.FAIL else t.state.name.lower())
    if outcome == Outcome.COMPLETED and t.violated:
        return "slo breached"
    return outcome


def _peak(t: TrialView) -> float | None:
    """A trial's tok/s for the history: its objective, else the best level it reached."""
    if t.value is not None:
        return t.value
    levels = [lv["output_throughput"] for lv in t.levels if lv.get("output_throughput")]
    return max(levels) if levels else None


def _value_text(value: Any) -> str:
    """A param value as people write it: 0.84 rather than 0.8400000000000001, ``unset`` for absent."""
    if value is None:
        return "unset"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _diff(best: dict[str, Any], baseline: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(param, baseline value, best value) for every param the best config changed."""
    names = list(dict.fromkeys([*baseline, *best]))
    return [(n, _value_text(baseline.get(n)), _value_text(best.get(n))) for n in names if baseline.get(n) != best.get(n)]


@dataclass(frozen=True)
class Palette:
    """The colour and label of every trial, the same in every chart."""

    baseline: int | None
    top: tuple[int, ...]

    def colour(self, t: TrialView) -> str:
        if t.number == self.baseline:
            return BASELINE_COLOUR
        if t.number in self.top:
            return TOP_COLOURS[self.top.index(t.number)]
        return OUTCOME_COLOURS.get(_outcome(t), OUTCOME_COLOURS["pruned"])

    def label(self, t: TrialView) -> str:
        if t.number == self.baseline:
            return f"#{t.number} baseline"
        if t.number in self.top:
            return f"#{t.number} " + ("best" if self.top.index(t.number) == 0 else f"top {self.top.index(t.number) + 1}")
        return f"#{t.number}"


def _palette(study: optuna.Study) -> Palette:
    ranked = [t for t in results.ranked(study) if t.feasible]
    base = next((t.number for t in _finished(study) if t.plan == Plan.BASELINE), None)
    return Palette(base, tuple(t.number for t in ranked if t.number != base)[:TOP])


def _shown(study: optuna.Study, palette: Palette) -> list[TrialView]:
    """The baseline then the top configs, the trials the per-level charts draw."""
    by_number = {t.number: t for t in views(study)}
    numbers = ([palette.baseline] if palette.baseline is not None else []) + list(palette.top)
    return [by_number[n] for n in numbers if by_number[n].levels]


# --------------------------------------------------------------------------- figure style


def _style(fig: go.Figure, height: int) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height, font={"family": _FONT, "size": 12, "color": "#1e293b"},
                      margin={"l": 70, "r": 24, "t": 36, "b": 56}, hoverlabel={"font": {"family": _FONT}},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "font": {"size": 11},
                              "traceorder": "normal"},
                      paper_bgcolor="rgba(0,0,0,0)")
    fig.update_xaxes(gridcolor="#eef2f7", zeroline=False)
    fig.update_yaxes(gridcolor="#eef2f7", zeroline=False)
    return fig


def _above(fig: go.Figure) -> go.Figure:
    """Subplots: the legend above the subplot titles rather than over them."""
    fig.update_layout(margin={"t": 78}, legend={"y": 1.14})
    return fig


def _slo_line(fig: go.Figure, limit: float | None, text: str, *, log: bool = False, **where: int) -> None:
    """A dashed red limit line, labelled; on a log axis plotly wants the label's y as log10."""
    if limit:
        label = {"text": text, "font": {"size": 10, "color": OUTCOME_COLOURS["crashed"]}}
        fig.add_hline(y=limit, line={"color": OUTCOME_COLOURS["crashed"], "dash": "dash", "width": 1.5},
                      annotation={**label, "y": math.log10(limit)} if log else label,
                      annotation_position="top left", **where)


def _duration_unit(seconds: float) -> tuple[float, str]:
    """Divisor and unit that keep a duration readable: s, min or h."""
    if seconds >= 2 * 3600:
        return 3600.0, "h"
    if seconds >= 120:
        return 60.0, "min"
    return 1.0, "s"


# --------------------------------------------------------------------------- the charts


def history(study: optuna.Study, palette: Palette) -> Section:
    """Each trial's peak (the objective: tok/s, or tok/s/GPU) when it finished, crashes on the floor, and the best
    feasible so far."""
    objective = space_of(study).objective
    trials = sorted((t for t in _finished(study) if t.datetime_complete), key=lambda t: t.datetime_complete or datetime.min)
    fig = go.Figure()
    symbols = {"completed": "circle", "slo breached": "circle-open", "pruned": "triangle-down",
               "crashed": "x", "infrastructure": "square-open"}
    for outcome, symbol in symbols.items():
        group = [t for t in trials if _outcome(t) == outcome]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[t.datetime_complete for t in group], y=[_peak(t) or 0.0 for t in group], mode="markers", name=outcome,
            marker={"symbol": symbol, "size": 11, "color": [palette.colour(t) for t in group],
                    "line": {"width": 2, "color": OUTCOME_COLOURS[outcome]}},
            text=[f"{palette.label(t)} · {results.outcome_text(t)}" for t in group], cliponaxis=False,
            hovertemplate=f"%{{text}}<br>%{{y:,.0f}} {objective.unit}<br>%{{x|%H:%M:%S}}<extra></extra>"))
    best, xs, ys = 0.0, [], []
    for t in trials:
        if _outcome(t) == "completed" and t.value is not None and t.value > best:
            best = t.value
        if best:
            xs.append(t.datetime_complete)
            ys.append(best)
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="best so far", line={"shape": "hv", "width": 2.5,
                                 "color": TOP_COLOURS[0]},
                                 hovertemplate=f"best so far %{{y:,.0f}} {objective.unit}<extra></extra>"))
    if palette.baseline is not None:
        base = next(t for t in trials if t.number == palette.baseline)
        if base.value:
            fig.add_hline(y=base.value, line={"color": BASELINE_COLOUR, "dash": "dot", "width": 1},
                          annotation={"text": f"baseline #{base.number}", "font": {"size": 10}},
                          annotation_position="bottom right")
    fig.update_xaxes(title="trial finished at")
    fig.update_yaxes(title=f"peak {objective.name} ({objective.unit})", rangemode="tozero")
    return Section("history", "Optimization history",
                   "Each trial's best output throughput that met the SLOs, at the time it finished. Pruned trials show "
                   "the last level they reached; crashed trials sit at zero.", _style(fig, 420) if trials else None,
                   "no trial has finished yet")


def _level_axis(fig: go.Figure, space: Space, shown: Sequence[float]) -> None:
    """A log x axis of ladder levels (rates or concurrencies, as the space's load test runs them),
    ticked at each level the space names or a trial measured (max_rate_under_slo refines rates)."""
    ticks = sorted({*space.load_test.levels, *shown})
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{x:g}" for x in ticks], title=space.load_test.axis)


def ladder(study: optuna.Study, space: Space, palette: Palette) -> Section:
    """Throughput and p99 latency per ladder level (concurrency or request rate): the baseline against the top configs."""
    shown = _shown(study, palette)
    title = f"Throughput against {space.load_test.level_name}"
    if not shown:
        return Section("ladder", title, "", None, "no trial has measured a level yet")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07,
                        subplot_titles=("output throughput", "p99 time to first token", "p99 inter-token latency"))
    for t in shown:
        levels = t.levels
        x = [level_at(lv) for lv in levels]
        for col, key in enumerate(("output_throughput", "p99_ttft_ms", "p99_itl_ms"), start=1):
            fig.add_trace(go.Scatter(
                x=x, y=[lv.get(key) for lv in levels], mode="lines+markers", name=palette.label(t),
                legendgroup=str(t.number), showlegend=col == 1, line={"color": palette.colour(t), "width": 2.5},
                marker={"size": 8}, customdata=[space.load_test.level_text(v) for v in x],
                hovertemplate=f"{palette.label(t)}<br>%{{customdata}}<br>%{{y:,.1f}}<extra></extra>"),
                row=1, col=col)
    if space.targets:
        fig.add_trace(go.Scatter(x=list(space.targets), y=list(space.targets.values()), mode="markers", name="target",
                                 marker={"symbol": "line-ew-open", "size": 26, "line": {"width": 3},
                                         "color": OUTCOME_COLOURS["crashed"]},
                                 hovertemplate="target at %{x}: %{y:,.0f} tok/s<extra></extra>"), row=1, col=1)
    _slo_line(fig, space.slos.p99_ttft_ms, "SLO", row=1, col=2)
    _slo_line(fig, space.slos.p99_itl_ms, "SLO", row=1, col=3)
    _level_axis(fig, space, [level_at(lv) for t in shown for lv in t.levels])
    fig.update_yaxes(title="tok/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=3)
    return Section("ladder", title,
                   "The baseline and the top configs at every level of the ladder; dashed lines are the SLOs, "
                   "bars the throughput targets.", _above(_style(fig, 420)))


def _pareto(points: Sequence[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Points no other point beats on both throughput (higher) and latency (lower), by throughput."""
    front, lowest = [], math.inf
    for x, y, label in sorted(points, key=lambda p: (-p[0], p[1])):
        if y < lowest:
            front.append((x, y, label))
            lowest = y
    return sorted(front)


def latency(study: optuna.Study, space: Space, palette: Palette) -> Section:
    """p99 TTFT and ITL against throughput over every measured level, the Pareto front marked."""
    trials = [t for t in _finished(study) if t.levels]
    if not trials:
        return Section("latency", "Latency against throughput", "", None, "no trial has measured a level yet")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("p99 time to first token", "p99 inter-token latency"))
    for col, key in enumerate(("p99_ttft_ms", "p99_itl_ms"), start=1):
        points = [(lv["output_throughput"], lv[key], f"{palette.label(t)} at {space.load_test.level_text(level_at(lv))}")
                  for t in trials for lv in t.levels
                  if lv.get(key) is not None and lv.get("output_throughput")]
        fig.add_trace(go.Scatter(
            x=[p[0] for p in points], y=[p[1] for p in points], mode="markers", name="trial level",
            showlegend=col == 1, legendgroup="levels",
            marker={"size": 8, "opacity": 0.75, "line": {"width": 0},
                    "color": [palette.colour(t) for t in trials for lv in t.levels
                              if lv.get(key) is not None and lv.get("output_throughput")]},
            text=[p[2] for p in points], hovertemplate="%{text}<br>%{x:,.0f} tok/s, %{y:,.1f} ms<extra></extra>"),
            row=1, col=col)
        front = _pareto(points)
        fig.add_trace(go.Scatter(
            x=[p[0] for p in front], y=[p[1] for p in front], mode="lines+markers", name="Pareto front",
            showlegend=col == 1, legendgroup="front", line={"color": TOP_COLOURS[0], "width": 2, "shape": "hv"},
            marker={"size": 12, "symbol": "circle-open", "line": {"width": 2.5}}, text=[p[2] for p in front],
            hovertemplate="Pareto: %{text}<br>%{x:,.0f} tok/s, %{y:,.1f} ms<extra></extra>"), row=1, col=col)
    _slo_line(fig, space.slos.p99_ttft_ms, "SLO", log=True, row=1, col=1)
    _slo_line(fig, space.slos.p99_itl_ms, "SLO", row=1, col=2)
    fig.update_xaxes(title="output throughput (tok/s)")
    fig.update_yaxes(title="ms", type="log", dtick=1, row=1, col=1)
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=2)
    return Section("latency", "Latency against throughput",
                   "Every level of every trial. On the Pareto front nothing else is both faster and quicker to answer.",
                   _above(_style(fig, 440)))


def importance(study: optuna.Study) -> Section:
    """Optuna's parameter importances, as `search study show` reports them."""
    found, why = results.importances(study)
    if not found:
        return Section("importance", "Parameter importances", "", None, why or "no importances yet")
    names = list(found)[::-1]
    fig = go.Figure(go.Bar(x=[found[n] for n in names], y=names, orientation="h", marker={"color": "#2563eb"},
                           hovertemplate="%{y}: %{x:.2f}<extra></extra>", text=[f"{found[n]:.2f}" for n in names],
                           textposition="outside", cliponaxis=False))
    fig.update_xaxes(title="importance (share of throughput variance explained)", range=[0, 1.08])
    return Section("importance", "Parameter importances",
                   f"How much of the spread in throughput each flag explains among completed trials ({why}).",
                   _style(fig, 90 + 34 * len(names)))


def _axis(values: Sequence[Any], categorical: bool) -> dict[str, Any]:
    """One parallel-coordinates dimension: int and float ranges as numbers, choices as ordered categories."""
    if not categorical and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return {"values": list(values)}
    order = sorted({v for v in values if v is not None}, key=lambda v: (str(type(v)), v))
    labels = [_value_text(v) for v in order] + (["unset"] if None in values else [])
    return {"values": [labels.index(_value_text(v)) for v in values], "tickvals": list(range(len(labels))),
            "ticktext": labels}


def parallel(study: optuna.Study, space: Space) -> Section:
    """Every measured config as one line across its flags, coloured by the throughput it reached."""
    trials = [t for t in _finished(study) if t.params and _peak(t) is not None and _outcome(t) != "infrastructure"]
    if len(trials) < 2:
        return Section("parallel", "Parallel coordinates", "", None, "needs two measured trials")
    dims = []
    for name, param in space.params.items():
        values = [t.params.get(name) for t in trials]
        if any(v is not None for v in values):
            dims.append({"label": name.lstrip("-"), **_axis(values, param.type in ("categorical", "bool"))})
    peaks = [_peak(t) or 0.0 for t in trials]
    dims.append({"label": "peak tok/s", "values": peaks})
    fig = go.Figure(go.Parcoords(dimensions=dims, line={"color": peaks, "colorscale": "Viridis", "showscale": True,
                                                        "colorbar": {"title": {"text": "tok/s"}}}))
    fig = _style(fig, 420)
    fig.update_layout(margin={"l": 60, "r": 60, "t": 70, "b": 30})
    return Section("parallel", "Parallel coordinates",
                   "One line per measured trial across its flags; drag along an axis to filter.", fig)


def _bins(values: Sequence[Any]) -> dict[Any, str]:
    """Row label per value: itself, or a range when a float flag took too many values to list."""
    distinct = sorted({v for v in values if v is not None}, key=lambda v: (str(type(v)), v))
    floats = distinct and all(isinstance(v, float) for v in distinct)
    labels = {v: _value_text(v) for v in distinct}
    if floats and len(distinct) > MAX_VALUES:
        lo, hi = distinct[0], distinct[-1]
        step = (hi - lo) / MAX_VALUES
        for v in distinct:
            i = min(MAX_VALUES - 1, int((v - lo) / step))
            labels[v] = f"{lo + i * step:.3g}–{lo + (i + 1) * step:.3g}"
    labels[None] = "unset"
    return labels


def outcomes(study: optuna.Study, space: Space) -> Section:
    """Which value of which flag crashed, in which phase; the deciding log lines on hover."""
    trials = [t for t in _finished(study) if _outcome(t) not in ("infrastructure",)]
    crashed = [t for t in trials if _outcome(t) == "crashed"]
    if not crashed:
        return Section("outcomes", "Outcome map", "", None, "no trial crashed")
    phases = [p for p in (*PHASES, "load_test") if any(_crash_phase(t) == p for t in crashed)]
    rows, z, text, hover = [], [], [], []
    for name in space.params:
        labels = _bins([t.params.get(name) for t in trials])
        for label in dict.fromkeys(labels.values()):  # value order, unset last
            group = [t for t in trials if labels[t.params.get(name)] == label]
            if not group:
                continue
            rows.append(f"{name} = {label}")
            z_row, text_row, hover_row = [], [], []
            for phase in phases:
                hit = [t for t in group if _outcome(t) == "crashed" and _crash_phase(t) == phase]
                z_row.append(len(hit) / len(group))
                text_row.append(f"{len(hit)}/{len(group)}" if hit else "")
                lines = "<br>".join(f"#{t.number}: {html.escape(_short((t.failure or {}).get('line', '')))}"
                                    for t in hit[:6])
                hover_row.append(f"<b>{html.escape(name)} = {html.escape(label)}</b><br>crashed in "
                                 f"{PHASE_LABELS[phase]}: {len(hit)} of {len(group)} trials" + (f"<br>{lines}" if lines else ""))
            z.append(z_row)
            text.append(text_row)
            hover.append(hover_row)
    fig = go.Figure(go.Heatmap(z=z, x=[PHASE_LABELS[p] for p in phases], y=rows, text=text, texttemplate="%{text}",
                               customdata=hover, hovertemplate="%{customdata}<extra></extra>", zmin=0, zmax=1,
                               colorscale=[[0, "#f8fafc"], [0.001, "#fee2e2"], [1, "#b91c1c"]], xgap=2, ygap=2,
                               colorbar={"title": {"text": "crash share"}, "tickformat": ".0%"}))
    fig.update_yaxes(autorange="reversed", tickfont={"family": "ui-monospace, SFMono-Regular, Menlo, monospace"})
    fig.update_xaxes(title="phase the server crashed in", side="bottom")
    fig = _style(fig, 110 + 24 * len(rows))
    fig.update_layout(margin={"l": 300, "r": 24, "t": 20, "b": 56})
    return Section("outcomes", "Outcome map",
                   "For each flag value tried: the share of its trials that crashed, by the phase they crashed in. "
                   "Hover for the deciding log line.", fig)


def _crash_phase(t: TrialView) -> str:
    phase = (t.failure or {}).get("phase") or "starting"
    return "load_test" if phase == "ready" else phase if phase in PHASES else "starting"


def _short(line: str, width: int = 140) -> str:
    line = line.strip()
    return line if len(line) <= width else line[: width - 1] + "…"


def startup(study: optuna.Study, palette: Palette) -> Section:
    """Seconds per startup phase for each trial, a cross where a start crashed."""
    trials = [t for t in _finished(study) if t.phases]
    if not trials:
        return Section("startup", "Startup time by phase", "", None, "no startup was recorded")
    labels = [palette.label(t) for t in trials]
    fig = go.Figure()
    for phase in PHASES:
        if phase not in PHASE_COLOURS or not any(phase in t.phases for t in trials):
            continue
        fig.add_trace(go.Bar(y=labels, x=[t.phases.get(phase, {}).get("duration", 0.0) for t in trials],
                             name=PHASE_LABELS[phase], orientation="h", marker={"color": PHASE_COLOURS[phase]},
                             hovertemplate=f"%{{y}}: {PHASE_LABELS[phase]} %{{x:,.1f}} s<extra></extra>"))
    crashed = [t for t in trials if _outcome(t) == "crashed" and _crash_phase(t) != "load_test"]
    if crashed:
        fig.add_trace(go.Scatter(
            y=[palette.label(t) for t in crashed], mode="markers", name="crashed",
            x=[sum(p.get("duration", 0.0) for n, p in t.phases.items() if n in PHASE_COLOURS) for t in crashed],
            marker={"symbol": "x", "size": 12, "color": OUTCOME_COLOURS["crashed"]},
            text=[html.escape(results.outcome_text(t)) for t in crashed], hovertemplate="%{y}: %{text}<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title="seconds from launch to ready")
    return Section("startup", "Startup time by phase",
                   "Where each trial's start-up went: weights, KV cache, autotune, graph capture, warmup.",
                   _style(fig, 120 + 22 * len(trials)))


def power(study: optuna.Study, space: Space, palette: Palette) -> Section:
    """Mean power per GPU at each level against the board limit, where the host reported it."""
    readings = {t.number: [g for g in t.gpu if g.get("power_w") is not None]
                for t in _finished(study)}
    trials = [t for t in _finished(study) if readings[t.number]]
    if not trials:
        return Section("power", "GPU power", "", None, "no GPU power was recorded (the host gave no nvidia-smi readings)")
    fig = go.Figure()
    highlighted = {palette.baseline, *palette.top}
    for t in sorted(trials, key=lambda t: t.number in highlighted):
        samples = readings[t.number]
        mine = t.number in highlighted
        fig.add_trace(go.Scatter(
            x=[g["concurrency"] for g in samples], y=[g["power_w"] for g in samples], mode="lines+markers",
            name=palette.label(t), showlegend=mine, line={"color": palette.colour(t) if mine else "#cbd5e1",
                                                          "width": 2.5 if mine else 1},
            customdata=[g.get("utilization_pct") for g in samples],
            hovertemplate=f"{palette.label(t)}<br>at %{{x}}: %{{y:,.0f}} W, %{{customdata:.0f}}% busy<extra></extra>"))
    limit = max((g.get("power_limit_w") or 0.0 for t in trials for g in readings[t.number]), default=0.0)
    _slo_line(fig, limit, f"power limit {limit:,.0f} W")
    _level_axis(fig, space, [g["concurrency"] for t in trials for g in readings[t.number]])
    fig.update_yaxes(title="power per GPU (W)", rangemode="tozero")
    return Section("power", "GPU power against its limit",
                   "Mean board power per GPU of the server over each level, against the board limit; grey lines are "
                   "the other trials.",
                   _style(fig, 380))


def gpu_time(study: optuna.Study) -> Section:
    """GPU time spent by outcome and on re-measurement, and what ending trials early saved
    (`search.results.gpu_time`)."""
    totals = results.gpu_time(study)
    if not totals["spent_s"]:
        return Section("gpu_time", "GPU time", "", None, "no GPU time recorded yet")
    div, unit = _duration_unit(totals["spent_s"] + totals["saved_s"])
    spent: dict[str, float] = {}
    for t in _finished(study):
        key = _outcome(t)
        spent[key] = spent.get(key, 0.0) + t.gpu_seconds
    colours = {**OUTCOME_COLOURS, "re-measurement": REMEASURE_COLOUR}
    if study.user_attrs.get(StudyAttr.REMEASURE_GPU_SECONDS):
        spent["re-measurement"] = float(study.user_attrs[StudyAttr.REMEASURE_GPU_SECONDS])
    fig = go.Figure()
    for outcome, seconds in spent.items():
        fig.add_trace(go.Bar(y=["spent"], x=[seconds / div], name=outcome, orientation="h",
                             marker={"color": colours[outcome]},
                             hovertemplate=f"{outcome}: %{{x:,.1f}} {unit}<extra></extra>"))
    fig.add_trace(go.Bar(y=["saved by pruning"], x=[totals["saved_s"] / div], name="saved", orientation="h",
                         marker={"color": TOP_COLOURS[0], "pattern": {"shape": "/"}},
                         hovertemplate=f"saved: %{{x:,.1f}} {unit}<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title=f"GPU wall time ({unit})")
    return Section("gpu_time", "GPU time spent and saved",
                   "Wall time the trials held the GPUs, by outcome, and the re-measurement runs of the top configs; "
                   "and the time pruning and early crashes saved against running every trial to the end.",
                   _style(fig, 230))


# --------------------------------------------------------------------------- the page


def _headline(study: optuna.Study, storage: str) -> str:
    """Best against baseline, the flags that changed, the re-measured spread, the export command."""
    gain = results.gain(study)
    storage_opt = "" if storage == DEFAULT_STORAGE else f" --storage {storage}"
    export = f"search study export {study.study_name} --format shell{storage_opt}"
    if gain is None:
        return ('<section class="card headline"><h2>No winner yet</h2><p>The study needs a completed baseline and '
                'a completed trial that meets the SLOs before it can name a best config.</p></section>')
    best = view(study, gain["best_trial"])
    base = view(study, gain["baseline_trial"])
    space = space_of(study)
    again = best.remeasured
    values = best.measurements
    objective = space.objective
    spread = (f"re-measured {len(values)}×: {', '.join(objective.format(v) for v in values)} "
              f"(spread {objective.format(max(values) - min(values))}, {((max(values) - min(values)) / statistics.fmean(values)):.1%})"
              if again else "measured once (the study ended before re-measuring)")
    flags = "".join(f"<tr><td><code>{html.escape(n)}</code></td><td>{html.escape(old)}</td><td>→</td>"
                    f"<td><b>{html.escape(new)}</b></td></tr>" for n, old, new in _diff(space.clean(best.params), space.clean(base.params)))
    at = best.peak_concurrency
    return f"""<section class="card headline">
  <div class="hero">
    <div class="big" style="color:{TOP_COLOURS[0]}">{gain['gain']:+.0%}</div>
    <div><h2>Trial #{best.number} beats the baseline #{base.number}</h2>
      <p class="lead"><b>{objective.format(gain['best_tok_s'])}</b> {html.escape(objective.name)} against
      {objective.format(gain['baseline_tok_s'])}
      {f'(peak at {space.load_test.level_text(at)})' if at and space.objective.metric != "max_rate_under_slo" else ''}</p>
      <p class="muted">{html.escape(spread)}</p></div>
  </div>
  <div class="split">
    <div><h3>Flags that changed</h3>
      <table class="flags">{flags or '<tr><td>none: the baseline won</td></tr>'}</table></div>
    <div><h3>Take it home</h3><pre><code>{html.escape(export)}</code></pre>
      <p class="muted">writes <code>profiles/{html.escape(study.study_name)}-trial{best.number}.sh</code>;
      <code>--format sglang-config</code> gives an SGLang <code>--config</code> file.</p></div>
  </div>
</section>"""


def _kpis(study: optuna.Study) -> str:
    """Trials that ended, by outcome (those still running or waiting named apart), and GPU time."""
    counts = results.counts(study)
    unfinished = {k: counts.pop(k) for k in ("running", "waiting") if k in counts}
    totals = results.gpu_time(study)
    div, unit = _duration_unit(totals["spent_s"] + totals["saved_s"])
    chips = "".join(f'<span class="chip" style="--c:{OUTCOME_COLOURS.get(k, "#64748b")}">{v} {html.escape(k)}</span>'
                    for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    later = " · ".join(f"{v} {k}" for k, v in unfinished.items())
    note = f'<p class="muted" data-unfinished>not counted: {later}</p>' if later else ""
    return (f'<div class="kpis"><div class="kpi"><span>trials finished</span>'
            f'<b>{sum(v for k, v in counts.items() if k != "retries")}</b><div>{chips}</div>{note}</div>'
            f'<div class="kpi"><span>GPU time spent</span><b>{totals["spent_s"] / div:,.1f} {unit}</b></div>'
            f'<div class="kpi"><span>saved by pruning</span><b>{totals["saved_s"] / div:,.1f} {unit}</b></div></div>')


def _ranking(study: optuna.Study) -> str:
    frame = results.table(study, TABLE_ROWS)
    if frame.empty:
        return ""
    head = (f"<tr><th>#</th><th>trial</th><th>outcome</th><th>{html.escape(space_of(study).objective.unit)}</th>"
            "<th>at</th><th>p99 TTFT ms</th><th>p99 ITL ms</th><th>changed from baseline</th></tr>")

    def known(v: Any) -> bool:  # pandas gives NaN for a missing number
        return v is not None and not (isinstance(v, float) and math.isnan(v))

    def cell(v: Any, digits: int = 0) -> str:
        return f"{v:,.{digits}f}" if known(v) else ""

    body = "".join(
        f"<tr><td>{r['rank']}</td><td>#{r['trial']}</td><td>{html.escape(r['outcome'])}</td>"
        f"<td class=num>{cell(r['mean_tok_s'] if known(r['mean_tok_s']) else r['peak_tok_s'])}</td>"
        f"<td class=num>{cell(r['at_concurrency'])}</td><td class=num>{cell(r['p99_ttft_ms'])}</td>"
        f"<td class=num>{cell(r['p99_itl_ms'], 1)}</td><td><code>{html.escape(r['changed'])}</code></td></tr>"
        for r in frame.to_dict(orient="records"))
    return (f'<section class="card"><h2>Ranking</h2><p class="muted">The order <code>search study show</code> and '
            f'<code>export</code> use: re-measured configs by their mean first.</p>'
            f'<div class="scroll"><table class="rank">{head}{body}</table></div></section>')


def _section_html(section: Section) -> str:
    if section.figure is None:
        body = f'<p class="missing" data-missing="{section.key}">{html.escape(section.missing)}</p>'
    else:
        body = section.figure.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG,
                                      div_id=f"chart-{section.key}")
        body = f'<div class="chart" data-chart="{section.key}">{body}</div>'
    caption = f'<p class="muted">{html.escape(section.caption)}</p>' if section.caption else ""
    return f'<section class="card" id="{section.key}"><h2>{html.escape(section.title)}</h2>{caption}{body}</section>'


def sections(study: optuna.Study, space: Space) -> list[Section]:
    """Every chart of the report, in page order."""
    palette = _palette(study)
    return [history(study, palette), ladder(study, space, palette), latency(study, space, palette),
            importance(study), parallel(study, space), outcomes(study, space), startup(study, palette),
            power(study, space, palette), gpu_time(study)]


def render(study: optuna.Study, storage: str = DEFAULT_STORAGE) -> str:
    """The whole report as one HTML document (plotly.js inlined once)."""
    if not _finished(study):
        raise BadInput(f"study {study.study_name!r} has no finished trial yet; report it once a trial has run")
    space = space_of(study)
    charts = "\n".join(_section_html(s) for s in sections(study, space))
    started = min((t.datetime_start for t in study.get_trials(deepcopy=False) if t.datetime_start), default=None)
    subtitle = " · ".join(x for x in (
        space.launch.model, f"tp {space.launch.tp}" if space.launch.tp else "tp searched", f"SGLang {space.sglang_version}",
        f"{space.load_test.level_name} {', '.join(f'{x:g}' for x in space.load_test.levels)}",
        f"started {started:%Y-%m-%d %H:%M}" if started else "") if x)
    page = Template((resources.files("search") / "report" / "page.html").read_text(encoding="utf-8"))
    return page.substitute(
        title=html.escape(f"search · {study.study_name}"), study=html.escape(study.study_name),
        subtitle=html.escape(subtitle), plotlyjs=get_plotlyjs(), kpis=_kpis(study),
        headline=_headline(study, storage), charts=charts, ranking=_ranking(study),
        generated=f"{datetime.now():%Y-%m-%d %H:%M}")


def write(study: optuna.Study, out: Path, storage: str = DEFAULT_STORAGE) -> Path:
    """Render the report into ``out`` (parents created) and return the path."""
    return write_output(out, render(study, storage))

