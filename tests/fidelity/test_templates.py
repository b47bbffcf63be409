"""Each emulator template (search/emulator/templates.yaml) is the real text of every version it
claims, at the real file and line: rendered with sample values, it fully matches the string the
real source formats there."""

from __future__ import annotations

import string
from typing import Any

import pytest

from search.emulator import logs
from tests.fidelity.realsource import DISTS, Location, pattern

VARIANTS = [(key, i, variant) for key, variants in logs.templates().items() for i, variant in enumerate(variants)]


def _sample(text: str) -> str:
    """The template filled as the emulator fills it: numbers where the spec wants one."""
    values: dict[str, Any] = {}
    for _, field, spec, conversion in string.Formatter().parse(text):
        if field is not None:
            values[field] = 12.5 if (spec or conversion) else "7"
    return text.format(**values)


def _locations(variant: dict[str, Any]) -> list[Location]:
    return [Location.parse(f"{dist}:{where}") for dist, where in variant.get("at", {}).items()]


@pytest.mark.parametrize(("key", "index", "variant"), VARIANTS, ids=[f"{k}[{i}]" for k, i, _ in VARIANTS])
def test_template_is_the_real_text(key: str, index: int, variant: dict[str, Any]) -> None:
    locations = _locations(variant)
    assert locations or variant.get("external"), f"{key}: no source location (at:) and no external: origin"
    assert all(loc.dist in DISTS for loc in locations), f"{key}: a location outside the wheels {DISTS}"
    text = variant["text"] if variant.get("literal") else _sample(variant["text"])
    for loc in locations:
        real = pattern(loc, variant.get("fixed"))
        assert real.fullmatch(text), f"{key} for {loc}:\n  emulator: {text!r}\n  real:     {real.pattern!r}"


def test_every_version_has_each_phase_line() -> None:
    """The startup lines the ranks print exist for every version (a version missing one would
    print nothing there, silently)."""
    for version in logs.VERSIONS:
        words = logs.WORDING[version]
        for key in ("dist_begin", "dist_end", "load_begin", "load_end", "shards_bar", "shards_desc", "kv_alloc",
                    "pool_end", "autotune_begin", "autotune_end", "graph_begin", "graph_end", "max_tokens",
                    "ready", "exception", "sigquit", "prefill", "decode", "graph_failed", "kv_oom"):
            assert key in words, f"{version} has no {key}"


def test_no_version_has_two_variants_of_a_key() -> None:
    for key, variants in logs.templates().items():
        claimed = [v for variant in variants for v in logs._variant_versions(variant)]
        assert len(claimed) == len(set(claimed)), f"{key}: a version claimed twice: {claimed}"


SEED_FAILURES = (  # flags that make the built-in landscape fail, one per kind of text
    ["--enable-flashinfer-allreduce-fusion"], ["--mem-fraction-static", "0.95"], ["--mem-fraction-static", "0.3"],
    ["--moe-runner-backend", "flashinfer_trtllm"], ["--moe-runner-backend", "flashinfer_mxfp4"],
    ["--moe-runner-backend", "flashinfer_cutlass", "--fp8-gemm-backend", "flashinfer_trtllm"],
)


@pytest.mark.parametrize("version", logs.VERSIONS)
def test_builtin_landscape_fails_with_the_versions_real_texts(version: str) -> None:
    """Each of these failure texts of the seed landscape is one the version raises, at its file
    and line (PyTorch's OOM message, which no wheel holds, appears only as the `{e}` inside
    SGLang's graph-capture failure)."""
    from search.emulator.landscape import Landscape
    from search.emulator.launch import parse_flags

    landscape = Landscape.load(None)
    raised = [v for variants in logs.templates().values() for v in variants
              if v.get("raise") and version in logs._variant_versions(v)]
    for args in SEED_FAILURES:
        outcome = landscape.startup(parse_flags(version, ["--model-path", "m", "--tp", "4", *args]), {})
        assert outcome is not None and "error" in outcome, args
        error = outcome["error"]
        matches = [v for v in raised for loc in _locations(v)
                   if error.startswith(f"{v['raise']}: ")
                   and pattern(loc, v.get("fixed")).fullmatch(error.removeprefix(f"{v['raise']}: "))]
        assert matches, f"{version} {args}: {error!r} is no text this version raises"
