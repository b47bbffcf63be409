"""Views on a study: the ranking, the table, counts, gain, GPU time, importances, one trial's story.

Everything here reads the per-trial user attributes of docs/architecture.md and never writes the
storage. The ranking is the one `search study export` uses: re-measured configs first, by the mean
of all their measurements (a lucky single run cannot beat a config measured three times), then
the other feasible completed trials, then the infeasible, pruned, crashed and failed ones.
"""

from __future__ import annotations

import io
import json
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.table import Table

from search.errors import BadInput
from search.space import Space
from search.study import remeasured, space_of
from search.varied import varied_params

FORMATS = ("table", "csv", "json")
MIN_FOR_IMPORTANCE = 3  # completed trials before parameter importances mean anything
CONTEXT_LINES = 3  # server.log lines shown either side of a failure line
_PHASE_SHORT = {"starting": "start", "loading": "load", "kv_cache": "kv", "autotune": "tune",
                "cuda_graph": "graph", "warmup": "warm", "ready": "ready"}


# --------------------------------------------------------------------------- ranking


def _feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and not any(v > 0 for v in (t.constraints or {}).values())


def _measurements(t: FrozenTrial, again: dict[int, list[float]]) -> list[float]:
    return ([t.value] if t.value is not None else []) + again.get(t.number, [])


def _tier(t: FrozenTrial, again: dict[int, list[float]]) -> int:
    if "skipped" in t.user_attrs:
        return 7
    if _feasible(t):
        return 0 if t.number in again else 1
    order = {TrialState.COMPLETE: 2, TrialState.PRUNED: 3, TrialState.FAIL: 5}
    tier = order.get(t.state, 6)
    return 4 if tier == 3 and t.user_attrs.get("outcome") == "crashed" else tier


def _sort_value(t: FrozenTrial, again: dict[int, list[float]]) -> float:
    values = _measurements(t, again)
    if values:
        return statistics.fmean(values)
    return max(t.intermediate_values.values(), default=0.0)


def ranked(study: optuna.Study) -> list[FrozenTrial]:
    """Every trial that ran or runs, best first (see the module docstring); skipped trials last.

    Planned trials still WAITING when a run ended have not run: they are not results.
    """
    again = remeasured(study)
    trials = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]
    return sorted(trials, key=lambda t: (_tier(t, again), -_sort_value(t, again), t.number))


def best(study: optuna.Study) -> FrozenTrial:
    """The trial the export takes by default: the top of the ranking, which must be feasible."""
    top = next(iter(ranked(study)), None)
    if top is None or not _feasible(top):
        raise BadInput(f"study {study.study_name!r} has no completed trial that meets its SLOs yet; "
                       "export a given trial with --trial N")
    return top


def trial(study: optuna.Study, number: int) -> FrozenTrial:
    """Trial ``number`` of the study; BadInput naming the range otherwise."""
    trials = study.get_trials(deepcopy=False)
    if not 0 <= number < len(trials):
        raise BadInput(f"study {study.study_name!r} has no trial {number}; its trials are 0..{len(trials) - 1}")
    return trials[number]


# --------------------------------------------------------------------------- one row


def outcome_text(t: FrozenTrial) -> str:
    """``crashed at autotune (oom)``, ``pruned at 256: 480 tok/s below ...``, ``completed, SLO breached``."""
    outcome = t.user_attrs.get("outcome", t.state.name.lower())
    failure = t.user_attrs.get("failure") or {}
    if "skipped" in t.user_attrs:
        return f"skipped: {t.user_attrs['skipped']}"
    if outcome in ("crashed", "infrastructure") and failure:
        return f"{outcome} at {failure.get('phase', '?')} ({failure.get('kind', '?')})"
    if outcome == "pruned":
        levels = t.user_attrs.get("levels", [])
        where = f" at {levels[-1]['max_concurrency']}" if levels else ""
        return f"pruned{where}: {t.user_attrs.get('pruned_because', '')}".rstrip(": ")
    broken = [name for name, v in (t.constraints or {}).items() if v > 0]
    return outcome + (f", {' and '.join('SLO breached' if b == 'slo' else 'answers differ' for b in broken if b != 'crashed')}"
                      if broken else "")


def changed(params: dict[str, Any], baseline: dict[str, Any]) -> str:
    """The params that differ from the baseline: ``--a=1 --b=x`` (``default``: the flag left to SGLang).

    A conditional param that went inactive is not listed: the change that turned it off is.
    """
    return " ".join(f"{k}={'default' if v is None else v}" for k, v in params.items()
                    if k not in baseline or baseline[k] != v)


def startup_text(phases: dict[str, dict[str, float]]) -> str:
    """Seconds per startup phase: ``load 61 kv 2 graph 20``."""
    return " ".join(f"{_PHASE_SHORT.get(name, name)} {span['duration']:.{0 if span['duration'] >= 10 else 1}f}"
                    for name, span in phases.items() if name != "ready")


def _level_at(t: FrozenTrial, concurrency: int | None) -> dict[str, Any] | None:
    levels = t.user_attrs.get("levels", [])
    match = [lv for lv in levels if lv.get("max_concurrency") == concurrency]
    return match[0] if match else (levels[-1] if levels else None)


def _top_gpu(t: FrozenTrial) -> dict[str, Any] | None:
    """The GPU record of the highest level measured: what the GPUs did under the most load.

    Not the peak level's: a pruned or crashed trial, or one where no level met the SLOs, has
    none, and those are the trials where "were the GPUs even busy?" matters most.
    """
    return max(t.user_attrs.get("gpu", []), key=lambda g: g["concurrency"], default=None)


def gpu_text(g: dict[str, Any] | None) -> str:
    """One level's GPU record as ``250/600 W 42%`` (power against its limit, utilization)."""
    if g is None or g.get("power_w") is None:
        return ""
    limit = f"/{g['power_limit_w']:.0f}" if g.get("power_limit_w") else ""
    busy = f" {g['utilization_pct']:.0f}%" if g.get("utilization_pct") is not None else ""
    return f"{g['power_w']:.0f}{limit} W{busy}"


def row(t: FrozenTrial, space: Space, again: dict[int, list[float]]) -> dict[str, Any]:
    """One trial as a flat record (the table, the CSV and the JSON share it)."""
    peak_c = t.user_attrs.get("peak_concurrency")
    at = _level_at(t, peak_c)
    values = _measurements(t, again)
    rec: dict[str, Any] = {
        "trial": t.number,
        "state": t.state.name,
        "outcome": outcome_text(t),
        "peak_tok_s": t.user_attrs.get("peak_output_throughput"),
        "at_concurrency": peak_c,
    }
    by_level = {lv["max_concurrency"]: lv["output_throughput"] for lv in t.user_attrs.get("levels", [])}
    for c in space.load_test.concurrency:
        rec[f"tok_s@{c}"] = by_level.get(c)
    top_gpu = _top_gpu(t)
    rec.update({
        "p99_ttft_ms": at["p99_ttft_ms"] if at else None,
        "p99_itl_ms": at["p99_itl_ms"] if at else None,
        "mean_tok_s": statistics.fmean(values) if t.number in again and values else None,
        "spread_tok_s": (max(values) - min(values)) if t.number in again and values else None,
        "repeats": len(values) if t.number in again else None,
        "changed": "(baseline)" if t.user_attrs.get("strategy") == "baseline" else changed(space.clean(t.params), dict(space.baseline or {})),
        "startup_s": startup_text(t.user_attrs.get("phases", {})),
        "gpu_power": gpu_text(top_gpu),  # at the highest level measured, gpu_at
        "gpu_at": top_gpu["concurrency"] if top_gpu else None,
        "gpu_limit_w": top_gpu.get("power_limit_w") if top_gpu else None,
        "host": t.user_attrs.get("host", ""),
    })
    gpu_by_level = {g["concurrency"]: g for g in t.user_attrs.get("gpu", [])}
    for c in space.load_test.concurrency:
        rec[f"gpu_w@{c}"] = gpu_by_level.get(c, {}).get("power_w")
        rec[f"gpu_util@{c}"] = gpu_by_level.get(c, {}).get("utilization_pct")
    return rec


# --------------------------------------------------------------------------- the study


def table(study: optuna.Study, top: int | None = None) -> pd.DataFrame:
    """The ranked table (skipped trials excluded; `counts` has them)."""
    space = space_of(study)
    again = remeasured(study)
    shown = [t for t in ranked(study) if "skipped" not in t.user_attrs]
    rows = [row(t, space, again) for t in shown[:top]]
    frame = pd.DataFrame(rows).convert_dtypes()  # nullable ints: "16", not "16.0", beside missing values
    if not frame.empty:
        frame.insert(0, "rank", range(1, len(frame) + 1))
    return frame


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials by outcome; skipped (never started) and retries counted apart."""
    found: Counter[str] = Counter()
    for t in study.get_trials(deepcopy=False):
        if "skipped" in t.user_attrs:
            found["skipped"] += 1
        elif t.state in (TrialState.RUNNING, TrialState.WAITING):
            found[t.state.name.lower()] += 1
        else:
            found[t.user_attrs.get("outcome", t.state.name.lower())] += 1
        if "retry_of" in t.user_attrs:
            found["retries"] += 1
    return dict(found)


def _baseline(study: optuna.Study) -> FrozenTrial | None:
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.user_attrs.get("strategy") == "baseline"]
    return done[0] if done else None


def gain(study: optuna.Study) -> dict[str, Any] | None:
    """The best feasible result against the baseline's; None until both exist."""
    base = _baseline(study)
    try:
        top = best(study)
    except BadInput:
        return None
    if base is None or not base.value:
        return None
    again = remeasured(study)
    value = statistics.fmean(_measurements(top, again))
    return {"baseline_trial": base.number, "baseline_tok_s": base.value, "best_trial": top.number,
            "best_tok_s": value, "gain": value / base.value - 1.0}


def gpu_time(study: optuna.Study) -> dict[str, float]:
    """GPU seconds spent, and saved by ending trials early: a pruned or crashed trial saved what a
    typical completed trial cost beyond its own time; a skipped one saved all of it."""
    trials = study.get_trials(deepcopy=False)
    spent = sum(float(t.user_attrs.get("gpu_seconds", 0.0)) for t in trials) + study.user_attrs.get("remeasure_gpu_seconds", 0.0)
    full = [float(t.user_attrs["gpu_seconds"]) for t in trials
            if t.user_attrs.get("outcome") == "completed" and "gpu_seconds" in t.user_attrs]
    if not full:
        return {"spent_s": spent, "saved_s": 0.0}
    typical = statistics.median(full)
    saved = 0.0
    for t in trials:
        if "skipped" in t.user_attrs:
            saved += typical
        elif t.user_attrs.get("outcome") in ("pruned", "crashed"):
            saved += max(0.0, typical - float(t.user_attrs.get("gpu_seconds", 0.0)))
    return {"spent_s": spent, "saved_s": saved}


def importances(study: optuna.Study) -> tuple[dict[str, float], str | None]:
    """Optuna's importances (its default PED-ANOVA evaluator) of the parameters that varied, with the rule
    they follow; or no importances and why."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if len(done) < MIN_FOR_IMPORTANCE:
        return {}, f"importances need {MIN_FOR_IMPORTANCE} completed trials ({len(done)} so far)"
    varied, fixed = varied_params(done)
    if not varied:
        return {}, "importances unavailable: no parameter varied among completed trials"
    try:
        found = optuna.importance.get_param_importances(study, params=varied)
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return {}, f"importances unavailable: {exc}"
    clean = {k: float(v) for k, v in found.items() if not math.isnan(v)}
    rule = f"PED-ANOVA over {len(done)} completed trials"
    if fixed:
        rule += f"; never varied, so none: {', '.join(fixed)}"
    return clean, rule if clean else "importances unavailable: no parameter varied among completed trials"


def summary(study: optuna.Study, top: int | None = None) -> dict[str, Any]:
    """Everything `study show` says, as data (its JSON format)."""
    imp, why = importances(study)
    frame = table(study, top)
    return {
        "study": study.study_name,
        "trials": json.loads(frame.to_json(orient="records")) if not frame.empty else [],
        "skipped": [{"trial": t.number, "reason": t.user_attrs["skipped"]} for t in study.get_trials(deepcopy=False)
                    if "skipped" in t.user_attrs],
        "counts": counts(study),
        "gain": gain(study),
        "gpu_time": gpu_time(study),
        "importances": imp,
        "importances_note": why,
    }


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else str(value)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.0f} s"


def show_text(study: optuna.Study, top: int | None = None, width: int = 200) -> str:
    """`study show` as text: the ranked table, then counts, gain, GPU time and importances."""
    data = summary(study, top)
    ladder = list(space_of(study).load_test.concurrency)
    grid = Table(title=f"study {study.study_name}", show_lines=False)
    columns = ["#", "trial", "outcome", "tok/s", "@", *[f"{c}" for c in ladder], "mean±spread",
               "p99 TTFT", "p99 ITL", "changed from baseline", "startup s", "GPU at top level", "host"]
    for name in columns:
        grid.add_column(name, overflow="fold")
    for r in data["trials"]:
        spread = (f"{_fmt(r['mean_tok_s'])}±{_fmt(r['spread_tok_s'] / 2)} (n={r['repeats']})"
                  if r["mean_tok_s"] is not None else "")
        grid.add_row(str(r["rank"]), str(r["trial"]), r["outcome"], _fmt(r["peak_tok_s"]), _fmt(r["at_concurrency"]),
                     *[_fmt(r[f"tok_s@{c}"]) for c in ladder], spread, _fmt(r["p99_ttft_ms"]),
                     _fmt(r["p99_itl_ms"], 1), r["changed"], r["startup_s"],
                     f"{r['gpu_power']} @{r['gpu_at']}" if r["gpu_power"] else "", r["host"])
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, no_color=True)
    console.print(grid)
    console.print("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(data["counts"].items())))
    for s in data["skipped"]:
        console.print(f"skipped trial {s['trial']}: {s['reason']}")
    g = data["gain"]
    console.print(f"gain: trial {g['best_trial']} {g['best_tok_s']:,.0f} tok/s vs baseline trial {g['baseline_trial']} "
                  f"{g['baseline_tok_s']:,.0f} tok/s ({g['gain']:+.1%})" if g else "gain: needs a completed baseline "
                  "and a feasible best trial")
    t = data["gpu_time"]
    console.print(f"GPU time: spent {_hours(t['spent_s'])}, saved by pruning {_hours(t['saved_s'])}")
    if data["importances"]:
        console.print("importances: " + ", ".join(f"{k} {v:.2f}" for k, v in data["importances"].items())
                      + f" ({data['importances_note']})")
    else:
        console.print(data["importances_note"])
    return out.getvalue()


def render(study: optuna.Study, fmt: str, top: int | None = None) -> str:
    """`study show` in the asked format."""
    if fmt == "table":
        return show_text(study, top)
    if fmt == "csv":
        return table(study, top).to_csv(index=False)
    if fmt == "json":
        return json.dumps(summary(study, top), indent=2) + "\n"
    raise BadInput(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")


# --------------------------------------------------------------------------- one trial


def failure_context(log: Path, line: str, around: int = CONTEXT_LINES) -> list[str]:
    """The server.log lines around the deciding failure line (the last occurrence), else the log's tail."""
    if not log.is_file():
        return []
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    hits = [i for i, text in enumerate(lines) if line and line.strip() and line.strip() in text]
    at = hits[-1] if hits else len(lines) - 1
    return lines[max(0, at - around): at + around + 1]


def trial_detail(study: optuna.Study, number: int) -> dict[str, Any]:
    """`trial show` as data: timeline, failure with context, levels, artifacts."""
    t = trial(study, number)
    artifacts = Path(t.user_attrs.get("artifacts", ""))
    failure = t.user_attrs.get("failure")
    return {
        "trial": t.number,
        "state": t.state.name,
        "outcome": outcome_text(t),
        "value": t.value,
        "params": space_of(study).clean(t.params),
        "phases": t.user_attrs.get("phases", {}),
        "failure": failure,
        "failure_context": failure_context(artifacts / "server.log", failure.get("line", "")) if failure else [],
        "levels": t.user_attrs.get("levels", []),
        "gpu": t.user_attrs.get("gpu", []),
        "remeasured": remeasured(study).get(t.number, []),
        "artifacts": sorted(str(p) for p in artifacts.rglob("*") if p.is_file()) if artifacts.is_dir() else [],
    }


def trial_text(study: optuna.Study, number: int, width: int = 160) -> str:
    """`trial show` as text."""
    d = trial_detail(study, number)
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, no_color=True, highlight=False)
    console.print(f"trial {d['trial']}: {d['state']}, {d['outcome']}" + (f", {d['value']:,.0f} tok/s" if d["value"] else ""))
    console.print("params: " + " ".join(f"{k}={v}" for k, v in d["params"].items()))
    if d["phases"]:
        first = min(span["start"] for span in d["phases"].values())
        console.print("startup:")
        for name, span in d["phases"].items():
            console.print(f"  +{span['start'] - first:7.1f} s  {name:<11} {span['duration']:7.1f} s")
    if d["failure"]:
        f = d["failure"]
        console.print(f"failure: {f.get('kind')} at {f.get('phase')}: {f.get('message') or f.get('line')}")
        for text in d["failure_context"]:
            console.print(("> " if f.get("line") and f["line"].strip() in text else "  ") + text, markup=False)
        for text in f.get("advice") or []:  # what the study's repairs act on
            console.print(f"SGLang suggests: {text}", markup=False)
    if d["levels"]:
        grid = Table("concurrency", "tok/s", "req/s", "p99 TTFT ms", "p99 ITL ms", "errors", title="levels")
        for lv in d["levels"]:
            grid.add_row(str(lv["max_concurrency"]), _fmt(lv["output_throughput"]), _fmt(lv["request_throughput"], 2),
                         _fmt(lv["p99_ttft_ms"]), _fmt(lv["p99_itl_ms"], 1), str(sum(lv.get("errors", {}).values())))
        console.print(grid)
    for g in d["gpu"]:
        console.print(f"GPU at {g['concurrency']}: {gpu_text(g) or 'no power reported'}")
    if d["remeasured"]:
        console.print("re-measured: " + ", ".join(f"{v:,.0f}" for v in d["remeasured"]) + " tok/s")
    console.print("artifacts:")
    for path in d["artifacts"]:
        console.print(f"  {path}", markup=False)
    return out.getvalue()
