"""Views on a study: the ranked table, counts, gain, GPU time, importances, one trial's story.

Everything here reads the stored record through `search.storage` and never writes the storage;
the order is `search.ranking`'s, the one every view and the export use.
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
from optuna.trial import TrialState
from rich.console import Console
from rich.table import Table

from search.errors import BadInput
from search.loadtest.metrics import level_at
from search.ranking import Ranking
from search.space import Space
from search.storage import Constraint, Outcome, Plan, StudyAttr, TrialView, baseline, space_of, view, views
from search.varied import varied_params

FORMATS = ("table", "csv", "json")
MIN_FOR_IMPORTANCE = 3  # completed trials before parameter importances mean anything
CONTEXT_LINES = 3  # server.log lines shown either side of a failure line
BROKEN = {Constraint.SLO: "SLO breached", Constraint.CORRECTNESS: "answers differ"}  # a completed trial's violated constraints
_PHASE_SHORT = {"starting": "start", "loading": "load", "kv_cache": "kv", "autotune": "tune",
                "cuda_graph": "graph", "warmup": "warm", "ready": "ready"}


# --------------------------------------------------------------------------- ranking


def ranking(study: optuna.Study) -> Ranking:
    """The ranking of the study's space."""
    return Ranking.of(space_of(study))


def ranked(study: optuna.Study) -> list[TrialView]:
    """Every trial that ran or runs, best first (`search.ranking`); skipped trials last."""
    return ranking(study).ranked(views(study))


def best(study: optuna.Study) -> TrialView:
    """The trial the export takes by default: the winner of the ranking."""
    top = ranking(study).best(views(study))
    if top is None:
        raise BadInput(f"study {study.study_name!r} has no completed trial that meets its SLOs yet; "
                       "export a given trial with --trial N")
    return top


# --------------------------------------------------------------------------- one row


def outcome_text(t: TrialView) -> str:
    """``crashed at autotune (oom)``, ``pruned at 256: 480 tok/s below ...``, ``completed, SLO breached``."""
    outcome = t.outcome or t.state.name.lower()
    failure = t.failure or {}
    if t.skipped is not None:
        return f"skipped: {t.skipped}"
    if outcome in (Outcome.CRASHED, Outcome.INFRASTRUCTURE) and failure:
        return f"{outcome} at {failure.get('phase', '?')} ({failure.get('kind', '?')})"
    if outcome == Outcome.PRUNED:
        where = f" at {t.levels[-1]['max_concurrency']}" if t.levels else ""
        return f"pruned{where}: {t.pruned_because}".rstrip(": ")
    broken = [BROKEN[Constraint(name)] for name in t.violated if name in BROKEN]
    return outcome + (f", {' and '.join(broken)}" if broken else "")


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


def _level_record(t: TrialView, where: float | None) -> dict[str, Any] | None:
    levels = t.levels
    match = [lv for lv in levels if level_at(lv) == where]
    return match[0] if match else (levels[-1] if levels else None)


def _top_gpu(t: TrialView) -> dict[str, Any] | None:
    """The GPU record of the highest level measured: what the GPUs did under the most load.

    Not the peak level's: a pruned or crashed trial, or one where no level met the SLOs, has
    none, and those are the trials where "were the GPUs even busy?" matters most.
    """
    return max(t.gpu, key=lambda g: g["concurrency"], default=None)


def gpu_text(g: dict[str, Any] | None) -> str:
    """One level's GPU record as ``250/600 W 42%`` (power against its limit, utilization)."""
    if g is None or g.get("power_w") is None:
        return ""
    limit = f"/{g['power_limit_w']:.0f}" if g.get("power_limit_w") else ""
    busy = f" {g['utilization_pct']:.0f}%" if g.get("utilization_pct") is not None else ""
    return f"{g['power_w']:.0f}{limit} W{busy}"


def ladder_columns(space: Space) -> list[tuple[str, float]]:
    """(column, level) of each ladder level: ``tok_s@256`` by concurrency, ``tok_s@4/s`` by request rate."""
    unit = "/s" if space.load_test.request_rates else ""
    return [(f"tok_s@{x:g}{unit}", x) for x in space.load_test.levels]


def row(t: TrialView, space: Space) -> dict[str, Any]:
    """One trial as a flat record (the table, the CSV and the JSON share it)."""
    peak_c = t.peak_concurrency
    at = _level_record(t, peak_c)
    values = t.measurements
    again = bool(t.remeasured) and bool(values)
    rec: dict[str, Any] = {
        "trial": t.number,
        "state": t.state.name,
        "outcome": outcome_text(t),
        "peak_tok_s": t.peak,
        "at_concurrency": peak_c,
    }
    for name, where in ladder_columns(space):
        rec[name] = next((lv["output_throughput"] for lv in t.levels if level_at(lv) == where), None)
    top_gpu = _top_gpu(t)
    rec.update({
        "p99_ttft_ms": at["p99_ttft_ms"] if at else None,
        "p99_itl_ms": at["p99_itl_ms"] if at else None,
        "mean_tok_s": t.mean if again else None,
        "spread_tok_s": (max(values) - min(values)) if again else None,
        "repeats": len(values) if t.remeasured else None,
        "changed": "(baseline)" if t.plan == Plan.BASELINE else changed(space.clean(t.params), dict(space.baseline or {})),
        "startup_s": startup_text(t.phases),
        "gpu_power": gpu_text(top_gpu),  # at the highest level measured, gpu_at
        "gpu_at": top_gpu["concurrency"] if top_gpu else None,
        "gpu_limit_w": top_gpu.get("power_limit_w") if top_gpu else None,
        "host": t.host,
    })
    gpu_by_level = {g["concurrency"]: g for g in t.gpu}
    for c in space.load_test.concurrency:
        rec[f"gpu_w@{c}"] = gpu_by_level.get(c, {}).get("power_w")
        rec[f"gpu_util@{c}"] = gpu_by_level.get(c, {}).get("utilization_pct")
    return rec


# --------------------------------------------------------------------------- the study


def table(study: optuna.Study, top: int | None = None) -> pd.DataFrame:
    """The ranked table (skipped trials excluded; `counts` has them)."""
    space = space_of(study)
    shown = [t for t in ranking(study).ranked(views(study)) if t.skipped is None]
    rows = [row(t, space) for t in shown[:top]]
    frame = pd.DataFrame(rows).convert_dtypes()  # nullable ints: "16", not "16.0", beside missing values
    if not frame.empty:
        frame.insert(0, "rank", range(1, len(frame) + 1))
    return frame


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials by outcome; skipped (never started) and retries counted apart."""
    found: Counter[str] = Counter()
    for t in views(study):
        if t.skipped is not None:
            found["skipped"] += 1
        elif t.state in (TrialState.RUNNING, TrialState.WAITING):
            found[t.state.name.lower()] += 1
        else:
            found[t.outcome or t.state.name.lower()] += 1
        if t.retry_of is not None:
            found["retries"] += 1
    return dict(found)


def gain(study: optuna.Study) -> dict[str, Any] | None:
    """The winner against the baseline; None until both exist."""
    base = baseline(study)
    top = ranking(study).best(views(study))
    if base is None or top is None or not base.value or top.mean is None:
        return None
    return {"baseline_trial": base.number, "baseline_tok_s": base.value, "best_trial": top.number,
            "best_tok_s": top.mean, "gain": top.mean / base.value - 1.0}


def gpu_time(study: optuna.Study) -> dict[str, float]:
    """GPU seconds spent, and saved by ending trials early: a pruned or crashed trial saved what a
    typical completed trial cost beyond its own time; a skipped one saved all of it."""
    trials = views(study)
    spent = sum(t.gpu_seconds for t in trials) + float(study.user_attrs.get(StudyAttr.REMEASURE_GPU_SECONDS, 0.0))
    full = [t.gpu_seconds for t in trials if t.outcome == Outcome.COMPLETED and t.gpu_seconds]
    if not full:
        return {"spent_s": spent, "saved_s": 0.0}
    typical = statistics.median(full)
    saved = 0.0
    for t in trials:
        if t.skipped is not None:
            saved += typical
        elif t.outcome in (Outcome.PRUNED, Outcome.CRASHED):
            saved += max(0.0, typical - t.gpu_seconds)
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
    objective = space_of(study).objective
    return {
        "study": study.study_name,
        "objective": {"metric": objective.name, "unit": objective.unit},
        "trials": json.loads(frame.to_json(orient="records")) if not frame.empty else [],
        "skipped": [{"trial": t.number, "reason": t.skipped} for t in views(study) if t.skipped is not None],
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


def _where_text(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.0f} s"


def show_text(study: optuna.Study, top: int | None = None, width: int = 200) -> str:
    """`study show` as text: the ranked table, then counts, gain, GPU time and importances."""
    data = summary(study, top)
    space = space_of(study)
    ladder = [name for name, _ in ladder_columns(space)]
    objective = space.objective
    digits = 2 if objective.unit == "req/s" else 0
    grid = Table(title=f"study {study.study_name}: {objective.name}, {objective.unit}", show_lines=False)
    columns = ["#", "trial", "outcome", objective.unit, "@", *[c.removeprefix("tok_s@") for c in ladder], "mean±spread",
               "p99 TTFT", "p99 ITL", "changed from baseline", "startup s", "GPU at top level", "host"]
    for name in columns:
        grid.add_column(name, overflow="fold")
    for r in data["trials"]:
        spread = (f"{_fmt(r['mean_tok_s'], digits)}±{_fmt(r['spread_tok_s'] / 2, digits)} (n={r['repeats']})"
                  if r["mean_tok_s"] is not None else "")
        grid.add_row(str(r["rank"]), str(r["trial"]), r["outcome"], _fmt(r["peak_tok_s"], digits),
                     _where_text(r["at_concurrency"]), *[_fmt(r[c]) for c in ladder], spread, _fmt(r["p99_ttft_ms"]),
                     _fmt(r["p99_itl_ms"], 1), r["changed"], r["startup_s"],
                     f"{r['gpu_power']} @{r['gpu_at']}" if r["gpu_power"] else "", r["host"])
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, no_color=True)
    console.print(grid)
    console.print("counts: " + ", ".join(f"{k} {v}" for k, v in sorted(data["counts"].items())))
    for s in data["skipped"]:
        console.print(f"skipped trial {s['trial']}: {s['reason']}")
    g = data["gain"]
    console.print(f"gain: trial {g['best_trial']} {objective.format(g['best_tok_s'])} vs baseline trial "
                  f"{g['baseline_trial']} {objective.format(g['baseline_tok_s'])} ({g['gain']:+.1%})" if g
                  else "gain: needs a completed baseline and a feasible best trial")
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
    t = view(study, number)
    artifacts = Path(t.artifacts)
    failure = t.failure
    return {
        "trial": t.number,
        "state": t.state.name,
        "outcome": outcome_text(t),
        "value": t.value,
        "params": space_of(study).clean(t.params),
        "phases": t.phases,
        "failure": failure,
        "failure_context": failure_context(artifacts / "server.log", failure.get("line", "")) if failure else [],
        "levels": t.levels,
        "gpu": t.gpu,
        "remeasured": list(t.remeasured),
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
