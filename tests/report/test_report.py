"""The report of a real demo study, seen the way a person sees it: headless Chromium loads the
file, nothing on the console complains, every chart drew data, and the screenshot is a page."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest
from optuna.trial import TrialState
from PIL import Image, ImageStat
from plotly.offline import get_plotlyjs

from search import report, results
from search.storage import StudyAttr, load, space_of
from tests.report.browser import PageView, view
from tests.report.conftest import CRASH_LINE, STUDY, search

CHARTS = ("history", "ladder", "latency", "importance", "parallel", "outcomes", "startup", "power", "gpu_time")


@pytest.fixture(scope="module")
def page(demo: Path) -> Path:
    done = search(demo, "study", "report", STUDY, "-o", "out/report.html")
    assert done.stdout.strip() == "out/report.html"
    return demo / "out" / "report.html"


@pytest.fixture(scope="module")
def seen(page: Path) -> tuple[PageView, Path]:
    shot = page.with_suffix(".png")
    return view(page, shot), shot


def test_page_loads_without_console_errors(seen: tuple[PageView, Path]) -> None:
    looked, _ = seen
    assert looked.errors == []


def test_every_chart_drew_data(seen: tuple[PageView, Path]) -> None:
    looked, _ = seen
    assert looked.missing == [], looked.text  # no section fell back to "no data yet"
    by_key = {c["key"]: c for c in looked.charts}
    assert sorted(by_key) == sorted(CHARTS)
    for key, chart in by_key.items():
        assert chart["traces"] > 0 and chart["points"] > 0, key
        assert chart["drawn"] > 0 and chart["height"] > 150, key  # plotly rendered it, at a visible size


def test_screenshot_is_a_page_not_a_blank(seen: tuple[PageView, Path]) -> None:
    _, shot = seen
    image = Image.open(shot).convert("RGB")
    width, height = image.size
    assert width == 1400 and height > 3000  # every section laid out below the header
    for top in range(0, height - 400, 400):  # no band of the page is empty
        band = image.crop((0, top, width, top + 400))
        assert max(ImageStat.Stat(band).stddev) > 8, f"blank band at y={top}"


def test_page_asks_the_network_for_nothing(seen: tuple[PageView, Path]) -> None:
    looked, _ = seen
    assert looked.requests == []


def test_file_is_self_contained_with_plotly_once(page: Path) -> None:
    text = page.read_text()
    bundle = get_plotlyjs()
    assert text.count(bundle) == 1
    rest = text.replace(bundle, "")
    assert not re.search(r"<script[^>]*\bsrc=", rest) and "https://" not in rest
    assert len(re.findall(r'data-chart="', rest)) == len(CHARTS)


def test_headline_names_the_winner_the_gain_and_the_export(demo: Path, seen: tuple[PageView, Path]) -> None:
    looked, _ = seen
    study = load(STUDY, f"sqlite:///{demo / 'studies.db'}")
    gain = results.gain(study)
    assert gain is not None and gain["gain"] > 0.5  # removing the cap of 1 is a clear win
    assert f"Trial #{gain['best_trial']} beats the baseline #{gain['baseline_trial']}" in looked.text
    assert f"{gain['gain']:+.0%}" in looked.text
    assert f"{gain['best_tok_s']:,.0f} tok/s" in looked.text
    assert "re-measured 2×" in looked.text  # the study re-measured the best once
    assert f"search study export {STUDY} --format shell" in looked.text
    assert "--max-running-requests" in looked.text  # the flag that made the win


def _study(demo: Path):  # type: ignore[no-untyped-def]
    study = load(STUDY, f"sqlite:///{demo / 'studies.db'}")
    return study, {s.key: s for s in report.sections(study, space_of(study))}


def test_history_marks_the_crash_the_prune_and_the_best_so_far(demo: Path) -> None:
    study, sections = _study(demo)
    traces = {t.name: t for t in sections["history"].figure.data}
    crashed = [t.number for t in study.trials if t.user_attrs.get("outcome") == "crashed"]
    pruned = [t.number for t in study.trials if t.user_attrs.get("outcome") == "pruned"]
    assert crashed and pruned
    assert [int(s.split()[0][1:]) for s in traces["crashed"].text] == crashed
    assert list(traces["crashed"].y) == [0.0] * len(crashed)
    assert [int(s.split()[0][1:]) for s in traces["pruned"].text] == pruned
    best = traces["best so far"].y
    assert list(best) == sorted(best) and best[-1] == max(t.value for t in study.trials
                                                          if t.state == TrialState.COMPLETE)


def test_outcome_map_shows_which_value_crashed_where_with_the_log_line(demo: Path) -> None:
    _, sections = _study(demo)
    heat = sections["outcomes"].figure.data[0]
    assert list(heat.x) == ["autotune"]
    row = list(heat.y).index("--moe-runner-backend = triton")
    assert heat.z[row][0] == 1.0 and heat.text[row][0] == "1/1"
    assert CRASH_LINE in heat.customdata[row][0]
    safe = list(heat.y).index("--moe-runner-backend = flashinfer_cutlass")
    assert heat.z[safe][0] == 0.0


def test_pareto_front_is_exactly_the_undominated_levels(demo: Path) -> None:
    _, sections = _study(demo)
    for levels, front in zip(sections["latency"].figure.data[0::2], sections["latency"].figure.data[1::2], strict=True):
        points = list(zip(levels.x, levels.y, strict=True))
        undominated = {p for p in points if not any(q != p and q[0] >= p[0] and q[1] <= p[1] for q in points)}
        assert set(zip(front.x, front.y, strict=True)) == undominated and undominated


def test_gpu_time_chart_adds_up_to_the_study_totals(demo: Path) -> None:
    study, sections = _study(demo)
    totals = results.gpu_time(study)
    div, _ = report._duration_unit(totals["spent_s"] + totals["saved_s"])
    bars = {t.name: t.x[0] * div for t in sections["gpu_time"].figure.data}
    assert math.isclose(sum(v for k, v in bars.items() if k != "saved"), totals["spent_s"], rel_tol=1e-9)
    assert math.isclose(bars["saved"], totals["saved_s"]) and totals["saved_s"] > 0


def test_gpu_time_spent_counts_the_re_measurement_runs(demo: Path) -> None:
    study, sections = _study(demo)
    trials = sum(t.user_attrs.get("gpu_seconds", 0.0) for t in study.trials)
    again = study.user_attrs[StudyAttr.REMEASURE_GPU_SECONDS]
    assert again > 0  # the demo re-measured its top configs once each
    assert math.isclose(results.gpu_time(study)["spent_s"], trials + again)
    div, _ = report._duration_unit(trials + again + results.gpu_time(study)["saved_s"])
    bars = {t.name: t.x[0] * div for t in sections["gpu_time"].figure.data}
    assert math.isclose(bars["re-measurement"], again)


def test_the_slo_lines_and_the_power_limit_are_drawn(demo: Path, seen: tuple[PageView, Path]) -> None:
    looked, _ = seen
    study = load(STUDY, f"sqlite:///{demo / 'studies.db'}")
    slos = space_of(study).slos
    charts = {c["key"]: c for c in looked.charts}
    ladder = {(line["yref"], line["y"]) for line in charts["ladder"]["lines"] if line["dash"] == "dash"}
    assert ladder == {("y2", slos.p99_ttft_ms), ("y3", slos.p99_itl_ms)}  # on the TTFT and ITL panels
    assert charts["ladder"]["labels"].count("SLO") == 2
    limit = max(g["power_limit_w"] for t in study.trials for g in t.user_attrs.get("gpu", []) if g.get("power_limit_w"))
    assert [line["y"] for line in charts["power"]["lines"]] == [limit]
    assert f"power limit {limit:,.0f} W" in charts["power"]["labels"]


def test_the_header_counts_finished_trials_and_names_unfinished_ones_apart(demo: Path, tmp_path: Path) -> None:
    shutil.copy(demo / "studies.db", tmp_path / "studies.db")
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    study = load(STUDY, storage)
    finished = sum(1 for t in study.trials if t.state not in (TrialState.RUNNING, TrialState.WAITING))
    study.enqueue_trial(study.trials[0].params)  # waiting
    study.ask()  # takes the enqueued trial: running
    study.enqueue_trial(study.trials[0].params)  # waiting
    header = re.search(r'<div class="kpis">.*?</div></div>', report.render(study, storage), re.S).group(0)
    assert f"<span>trials finished</span><b>{finished}</b>" in header
    assert "not counted: 1 running · 1 waiting" in header
    assert "waiting</span>" not in header and "running</span>" not in header  # no chip counts them as outcomes


def test_startup_bars_are_the_recorded_phase_durations(demo: Path) -> None:
    study, sections = _study(demo)
    weights = next(t for t in sections["startup"].figure.data if t.name == "weights")
    recorded = [t.user_attrs["phases"]["loading"]["duration"] for t in study.trials if t.user_attrs.get("phases")]
    assert list(weights.x) == recorded


def test_unknown_study_is_a_one_line_bad_input(demo: Path) -> None:
    done = search(demo, "study", "report", "nope", check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "no study named 'nope'" in done.stderr


def test_a_study_with_no_finished_trial_is_refused(demo: Path, tmp_path: Path) -> None:
    import optuna

    from search.errors import BadInput

    storage = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.create_study(study_name="empty", storage=storage)
    with pytest.raises(BadInput, match="no finished trial"):
        report.render(optuna.load_study(study_name="empty", storage=storage))
