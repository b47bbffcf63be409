"""Each log signature (search/signatures/*.yaml) matches the real text it names, in every version
it claims, and that text, rendered from the real f-string with sample values, gets the right
phase and failure from the real classifier."""

from __future__ import annotations

import io
from importlib import resources
from typing import Any

import pytest
import yaml

from search.emulator import logs
from search.logwatch import LogClassifier
from tests.fidelity.realsource import (
    DISTS,
    SGLANG_VERSIONS,
    Location,
    function_at,
    render,
    source_lines,
)

PREFIX = "[2026-03-01 09:00:00 TP0] "
# The SGLang versions that pin each FlashInfer (the wheels' Requires-Dist; 0.5.8.post1 pins
# 0.6.1, whose wording 0.6.3 keeps).
FLASHINFER_OF = {"flashinfer_python-0.6.3": ("0.5.8.post1", "0.5.9"), "flashinfer_python-0.7.2": ("0.5.23",)}


def _yaml(name: str) -> dict[str, Any]:
    return yaml.safe_load(resources.files("search").joinpath("signatures", name).read_text(encoding="utf-8"))


FILES = {entry.name: _yaml(entry.name) for entry in resources.files("search").joinpath("signatures").iterdir()
         if entry.name.endswith(".yaml") and entry.name != "advice.yaml"}
ENTRIES = (
    [(name, "phase", phase, e) for name, data in FILES.items() for phase, es in (data.get("phases") or {}).items() for e in es]
    + [(name, "frame", phase, e) for name, data in FILES.items() for phase, es in (data.get("frames") or {}).items() for e in es]
    + [(name, "failure", e["kind"], e) for name, data in FILES.items() for e in data.get("failures") or ()]
)
IDS = [f"{name}:{what}:{target}:{e['pattern'][:40]}" for name, what, target, e in ENTRIES]


def _versions(loc: Location) -> tuple[str, ...]:
    return FLASHINFER_OF.get(loc.dist) or (loc.dist.removeprefix("sglang-"),)


def _classify(version: str, text: str) -> LogClassifier:
    classifier = LogClassifier(version)
    for line in text.splitlines():
        classifier.feed(PREFIX + line)
    return classifier


@pytest.mark.parametrize(("name", "what", "target", "entry"), ENTRIES, ids=IDS)
def test_signature_names_real_text(name: str, what: str, target: str, entry: dict[str, Any]) -> None:
    locations = [Location.parse(str(at)) for at in entry.get("at") or ()]
    assert locations or entry.get("external"), f"{entry['pattern']!r} names no source (at:) and no external: origin"
    assert all(loc.dist in DISTS for loc in locations)
    family = FILES[name].get("versions")
    if family:  # a family file's pattern serves, so claims, each version of the family
        claimed = {v for loc in locations for v in _versions(loc)}
        assert set(family) <= claimed, f"{entry['pattern']!r}: no source for {set(family) - claimed}"
    pattern = __import__("re").compile(entry["pattern"])
    for loc in locations:
        if what == "frame":  # the function (or file) a traceback frame names
            assert pattern.search(f"in {function_at(loc)}") or pattern.search(loc.path), f"{loc}: {function_at(loc)}"
            continue
        text = render(loc, entry.get("sample") or {})
        if entry.get("raise"):
            text = f"{entry['raise']}: {text}"
        assert pattern.search(text), f"{entry['pattern']!r} misses the real text at {loc}: {text!r}"
        for version in _versions(loc):
            classifier = _classify(version, text)
            if what == "phase":
                assert classifier.phase == target, f"{loc} in {version}: {text!r} read as {classifier.phase}"
                assert classifier.failure is None
            else:
                assert classifier.failure is not None and classifier.failure.name == target, \
                    f"{loc} in {version}: {text!r} read as {classifier.failure}"
                if entry.get("phase"):
                    assert classifier.failure.phase == entry["phase"]


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_emulator_frames_are_the_real_call_chain(version: str) -> None:
    """frames.yaml: each frame's line holds that source and lies in that function."""
    for phase, frames in logs.FRAMES[version].items():
        for path, line, func, code in frames:
            loc = Location.parse(f"{version}:{path}:{line}")
            assert source_lines(loc.file)[line - 1].strip() == code, f"{phase}: {loc} is not {code!r}"
            assert function_at(loc) == func, f"{phase}: {loc} lies in {function_at(loc)}, not {func}"


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
@pytest.mark.parametrize(("phase", "kind"), [("starting", "crash"), ("unbalanced", "crash"), ("loading", "crash"),
                                             ("kv_cache", "crash"), ("autotune", "autotune_error"),
                                             ("cuda_graph", "cuda_graph_error")])
def test_a_traceback_through_the_real_chain_names_its_step(version: str, phase: str, kind: str) -> None:
    """An exception with no signature of its own, raised at the end of each step's real call chain
    (0.5.23: the autotune under init_cuda_graphs), is filed under that step."""
    log = logs.Logger(version, 0, False, io.StringIO())
    classifier = _classify(version, "Scheduler hit an exception: " + log.traceback(phase, "RuntimeError: boom"))
    step = "starting" if phase == "unbalanced" else phase
    assert classifier.failure is not None and (classifier.failure.name, classifier.failure.phase) == (kind, step)


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_loading_bars_report_progress(version: str) -> None:
    """The real BAR_FORMAT with each real loader description: the watcher reads the percentage."""
    loading = [Location.parse(str(at)) for e in FILES["common.yaml"]["phases"]["loading"] for at in e.get("at") or ()
               if "weight_utils" in str(at) and str(at).startswith(version + ":")]
    assert loading
    bar_format = next(v["text"] for v in logs.templates()["shards_bar"] if version in v.get("at", {}))
    for loc in loading:
        line = bar_format.format(desc=render(loc, {}), percentage=54.0, n_fmt=45, total_fmt=83, elapsed="00:10",
                                 remaining="00:08", rate_fmt="4.50it/s")
        classifier = _classify(version, line)
        assert (classifier.phase, classifier.progress) == ("loading", 54.0), f"{loc}: {line!r}"


ADVICE_SOURCES = ("0.5.9:model_executor/cuda_graph_runner.py:936",
                  "0.5.23:model_executor/runner_backend_utils/__init__.py:15")


def test_usual_advice_is_sglangs_own_lines() -> None:
    """signatures/advice.yaml: every line is a line of a version's graph-capture advice."""
    real = {line for at in ADVICE_SOURCES for line in render(Location.parse(at), {}).splitlines()}
    for kind, text in _yaml("advice.yaml").items():
        for line in text.splitlines():
            assert line in real, f"advice for {kind}: {line!r} is no line SGLang prints"
