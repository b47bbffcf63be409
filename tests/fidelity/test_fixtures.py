"""Every line of a per-version log fixture (tests/fixtures/logs/versions/v<version>_*.log) is text
that version prints: rendered from a string at a real file and line of its wheel (a template's or
a signature's `at`, or one of EXTRA_SOURCES below), a traceback frame whose file, line, function
and code are the wheel's, a tqdm bar around such a description, or the text of another program
named in EXTERNAL (uvicorn, Python, ninja, PyTorch), checked against that program's installed
source where it is installed. A message that spans lines (a traceback's last line with SGLang's
advice under it) is matched with the lines that follow it.

The users' logs under real/ are not held to this: they are what users pasted, of every age.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from search.emulator import logs
from tests.fidelity.realsource import ROOT, Location, function_at, pattern, source_lines, string_at

VERSIONS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "versions"
FIXTURES = sorted(VERSIONS_DIR.glob("v*.log"))
FLASHINFER = {"0.5.8.post1": "flashinfer_python-0.6.3", "0.5.9": "flashinfer_python-0.6.3",
              "0.5.23": "flashinfer_python-0.7.2"}

# Lines the fixtures carry that neither the emulator's templates nor the signatures name.
EXTRA_SOURCES = {
    "0.5.8.post1": ["entrypoints/engine.py:960",  # logger.info(f"{server_args=}")
                    "mem_cache/memory_pool.py:605",  # the MHA pool's "K size: ..., V size: ..."
                    "flashinfer_python-0.6.3:flashinfer/autotuner.py:497",  # "Skipping tactic ..."
                    "server_args.py:5410",  # print_deprecated_warning: the message in bold yellow
                    "server_args.py:5421"],  # DeprecatedAction's message
    "0.5.9": ["entrypoints/engine.py:1031", "server_args.py:5726", "server_args.py:5737",
              "mem_cache/memory_pool.py:652", "flashinfer_python-0.6.3:flashinfer/autotuner.py:497"],
    "0.5.23": ["entrypoints/engine.py:1185", "arg_groups/argparse_actions.py:29",
               "arg_groups/argparse_actions.py:72", "arg_groups/argparse_actions.py:98",
               "arg_groups/argparse_actions.py:130", "arg_groups/argparse_actions.py:146"],
}

# ("<exception class>@<where>": the text raised, printed as "<class>: <text>")
# Text of other programs: (regex of the message, module whose installed source holds `literal`,
# literal) or (regex, None, origin) where the program is not installed here.
EXTERNAL = [
    (r"Traceback \(most recent call last\):", "traceback", "Traceback (most recent call last):"),
    (r"The above exception was the direct cause of the following exception:", "traceback",
     "The above exception was the direct cause "),
    (r"subprocess\.CalledProcessError: Command '.*' returned non-zero exit status \d+\.", "subprocess",
     "returned non-zero exit status"),
    (r"ninja: build stopped: subcommand failed\.", None, "ninja src/build.cc"),
    (r"(?:torch\.OutOfMemoryError: )?CUDA out of memory\. Tried to allocate .*", None,
     "PyTorch c10/cuda/CUDACachingAllocator.cpp"),
    (r"torch\.AcceleratorError: CUDA error: an illegal memory access was encountered", None,
     "PyTorch c10/cuda/CUDAException (cudaErrorIllegalAddress)"),
    (r"requests\.exceptions\.ConnectionError: HTTPConnectionPool\(.*Max retries exceeded.*", None,
     "urllib3/requests (the HTTP warmup's GET /model_info refused)"),
    # uvicorn through SGLang's uvicorn formats ("[%(asctime)s] %(levelprefix)s %(message)s")
    (r"INFO: {5}Started server process \[\d+\]", "uvicorn.server", "Started server process [%d]"),
    (r"INFO: {5}Waiting for application startup\.", "uvicorn.lifespan.on", "Waiting for application startup."),
    (r"INFO: {5}Application startup complete\.", "uvicorn.lifespan.on", "Application startup complete."),
    (r"INFO: {5}Waiting for application shutdown\.", "uvicorn.lifespan.on", "Waiting for application shutdown."),
    (r"INFO: {5}Application shutdown complete\.", "uvicorn.lifespan.on", "Application shutdown complete."),
    (r"INFO: {5}Uvicorn running on http://[\d.]+:\d+ \(Press CTRL\+C to quit\)", "uvicorn.server",
     "(Press CTRL+C to quit)"),
    (r'INFO: {5}[\d.]+:\d+ - "(?:GET|POST) /\S* HTTP/1\.1" \d{3} [A-Za-z ]+', "uvicorn.logging",
     "HTTP/{http_version}"),
    (r"ERROR: {4}\[Errno 98\] error while attempting to bind on address \('[\d.]+', \d+\): address already in use",
     "asyncio.base_events", "error while attempting to bind on "),
    (r"ERROR: {4}Exception in ASGI application", "uvicorn.protocols.http.httptools_impl",
     "Exception in ASGI application"),
]

# configure_logger: "[%(asctime)s{maybe_ms}{prefix}] %(message)s", prefix " DPn TPn EPn" as set
PREFIX = re.compile(r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?(?: (?:DP|PP|TP|EP)\d+)*\] ")
# The seed's log: a warning logged while the server's arguments are parsed, before SGLang's own
# configure_logger, reads "[time] WARNING server_args.py:1177: ..." (shared/seeds/002).
LEVEL_AT = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR) (?P<file>[\w.]+\.py):(?P<line>\d+): ")
FRAME = re.compile(r'  File "[^"]*/(?:site|dist)-packages/(?P<path>(?P<pkg>sglang|flashinfer)/[^"]+)", '
                   r"line (?P<line>\d+), in (?P<func>\S+)")
ANY_FRAME = re.compile(r'  File "[^"]+", line \d+, in \S+')
# tqdm: SGLang's BAR_FORMAT for the loaders, tqdm's default for graph capture
BAR = re.compile(r"(?P<desc>.+?): +\d+%(?: Completed \| |\|[^|]*\| )\d+/\d+ \[[^\]]*\] *")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _version(path: Path) -> str:
    match = re.match(r"v(\d+\.\d+\.\d+(?:\.post\d+)?)_", path.name)
    assert match, f"{path.name}: a per-version fixture is named v<version>_<what>.log"
    return match.group(1)


def _loc(version: str, where: str) -> Location:
    return Location.parse(where if where.startswith(("sglang-", "flashinfer")) else f"{version}:{where}")


@cache
def _patterns(version: str) -> dict[str, tuple[re.Pattern[str], ...]]:
    """Every real string the fixtures may render for `version`: "sglang" (SGLang's log lines and
    any raised text) and "flashinfer" (what FlashInfer logs through its own handler only)."""
    locs: list[tuple[Location, dict[str, str] | None, str | None]] = []
    for variants in logs.templates().values():
        for variant in variants:
            if version in logs._variant_versions(variant) and not variant.get("literal"):
                locs += [(Location.parse(f"{d}:{w}"), variant.get("fixed"), variant.get("raise"))
                         for d, w in variant.get("at", {}).items()]
    signatures = Path(__file__).resolve().parents[2] / "search" / "signatures"
    for file in signatures.glob("*.yaml"):
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
        entries = [e for es in (data.get("phases") or {}).values() for e in es] + list(data.get("failures") or ())
        for entry in entries:
            for at in entry.get("at") or ():
                loc = Location.parse(str(at))
                if loc.dist in (f"sglang-{version}", FLASHINFER[version]):
                    locs.append((loc, None, entry.get("raise")))
    for where in EXTRA_SOURCES[version]:
        raised, _, where = where.rpartition("@")
        locs.append((_loc(version, where), None, raised or None))
    out: dict[str, list[re.Pattern[str]]] = {"sglang": [], "flashinfer": []}
    for loc, fixed, raised in locs:
        # a raised text is printed as the traceback's last line, "<class>: <text>"
        regex = re.escape(f"{raised}: ") + pattern(loc, fixed).pattern if raised else pattern(loc, fixed).pattern
        logged_by_flashinfer = loc.dist.startswith("flashinfer") and not raised
        out["flashinfer" if logged_by_flashinfer else "sglang"].append(re.compile(regex, re.DOTALL))
    return {k: tuple(v) for k, v in out.items()}


# FlashInfer's own handler (jit/core.py): "%(asctime)s - %(levelname)s - %(filename)s:%(lineno)d - flashinfer.jit: "
FLASHINFER_LINE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} - (?:DEBUG|INFO|WARNING|ERROR) - "
                             r"(?P<file>[\w.]+\.py):(?P<line>\d+) - flashinfer\.jit: (?P<message>.*)")


def _is_real(version: str, message: str, group: str = "sglang") -> bool:
    if any(p.fullmatch(message) for p in _patterns(version)[group]):
        inner = re.fullmatch(r"\x1b\[1;33m(.*)\x1b\[0m", message, re.DOTALL)  # print_deprecated_warning
        return inner is None or _is_real(version, inner.group(1))
    return group == "sglang" and any(re.fullmatch(regex, message, re.DOTALL) for regex, _, _ in EXTERNAL)


def _at_file_line(version: str, name: str, line: int, message: str) -> bool:
    """`[time] LEVEL name.py:N: message`: the string of the logging call at line N (the record's
    lineno is the call's first line; its string follows within two lines) of a file so named."""
    for file in (ROOT / f"sglang-{version}").rglob(name):
        for at in (line, line + 1, line + 2):
            loc = Location(f"sglang-{version}", str(file.relative_to(ROOT / f"sglang-{version}")), (at,))
            try:
                string_at(loc, at)
            except AssertionError:
                continue
            if pattern(loc).fullmatch(message):
                return True
    return False


def _frame_ok(version: str, frame: re.Match[str], code: str) -> str | None:
    dist = f"sglang-{version}" if frame["pkg"] == "sglang" else FLASHINFER[version]
    loc = Location(dist, frame["path"], (int(frame["line"]),))
    if not loc.file.is_file():
        return f"{loc}: no such file"
    lines = source_lines(loc.file)
    if loc.line > len(lines):
        return f"{loc}: the file has {len(lines)} lines"
    real = lines[loc.line - 1].strip()
    if real != code.strip():
        return f"{loc} is {real!r}, not {code.strip()!r}"
    if function_at(loc) != frame["func"]:
        return f"{loc} lies in {function_at(loc)}, not {frame['func']}"
    return None


def _problems(path: Path) -> list[str]:
    version = _version(path)
    segments = [seg for line in path.read_text(encoding="utf-8").split("\n") for seg in line.split("\r")]
    problems, i = [], 0
    while i < len(segments):
        seg = segments[i]
        i += 1
        if not seg:
            continue
        frame = FRAME.fullmatch(seg)
        if frame or ANY_FRAME.fullmatch(seg):
            code = segments[i] if i < len(segments) else ""
            i += 1
            error = _frame_ok(version, frame, code) if frame else None
            if error:
                problems.append(f"{path.name}: frame {seg.strip()!r}: {error}")
            continue
        flashinfer = FLASHINFER_LINE.fullmatch(seg)
        if flashinfer:
            if not _is_real(version, flashinfer["message"], "flashinfer"):
                problems.append(f"{path.name}: {seg!r}: no text {FLASHINFER[version]} logs")
            continue
        head = PREFIX.match(seg)
        message = seg[head.end():] if head else seg
        level = LEVEL_AT.match(message) if head else None
        if level:
            if not _at_file_line(version, level["file"], int(level["line"]), message[level.end():]):
                problems.append(f"{path.name}: {seg!r}: not the text at {level['file']}:{level['line']}")
            continue
        bar = BAR.fullmatch(message)
        if bar and _is_real(version, bar["desc"]):
            continue
        # a message of several lines: the shortest run of the following lines that makes one
        for j in range(0, min(12, len(segments) - i + 1)):
            if _is_real(version, "\n".join([message, *segments[i:i + j]])):
                i += j
                break
        else:
            problems.append(f"{path.name}: {seg!r}: no text {version} prints")
    return problems


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_every_fixture_line_is_the_versions_own_text(path: Path) -> None:
    problems = _problems(path)
    assert not problems, "\n".join(problems)


def test_external_texts_are_their_programs_own() -> None:
    """The other programs' texts above occur in their installed source (uvicorn, Python)."""
    for _, module, literal in EXTERNAL:
        if module is None:
            continue
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, module
        assert literal in Path(spec.origin).read_text(encoding="utf-8"), f"{literal!r} not in {spec.origin}"


def test_there_are_fixtures_of_every_version() -> None:
    assert {_version(p) for p in FIXTURES} == set(logs.VERSIONS)
    assert not [p for p in FIXTURES if ANSI.search(p.read_text()) and "1;33m" not in p.read_text()], \
        "ANSI colour in a fixture other than SGLang's deprecation warning (print_deprecated_warning)"


@pytest.mark.parametrize("version", logs.VERSIONS)
def test_emulator_deprecation_warnings_are_the_versions_own(version: str) -> None:
    """Every retired flag of the version's manifest: the emulator's warning is the real text at the
    real logging call (print_deprecated_warning's ANSI wrapper around the action's message, or
    0.5.23's post-parse hook), and the watcher reads it as no failure."""
    import io

    from search import manifests
    from search.emulator.launch import parse_flags, print_deprecations
    from search.logwatch import LogClassifier

    manifest = manifests.load(version)
    retired = [f for f in manifest.flags if "deprecated" in str(f.kind) or f.replacement]
    assert retired
    for flag in retired:
        option = flag.options[0]
        args = [option] if flag.nargs in (0, None) and "store" in str(flag.kind) or flag.kind == "deprecated" \
            else [option, str(flag.choices[0]) if flag.choices else "1"]
        messages: list[str] = []
        try:
            flags = parse_flags(version, ["--model-path", "m", *args], messages)
        except SystemExit:  # a retired flag SGLang refuses outright (error_message)
            continue
        out = io.StringIO()
        print_deprecations(logs.Logger(version, None, False, out), flags, messages)
        lines = out.getvalue().splitlines()
        assert lines, f"{version} {option}: no warning"
        classifier = LogClassifier(version)
        for line in lines:
            message = line[PREFIX.match(line).end():]  # type: ignore[union-attr]
            level = LEVEL_AT.match(message)
            assert level, line
            text = message[level.end():]
            assert _at_file_line(version, level["file"], int(level["line"]), text), f"{version} {option}: {line!r}"
            inner = re.fullmatch(r"\x1b\[1;33m(.*)\x1b\[0m", text, re.DOTALL)
            assert inner is None or _is_real(version, inner.group(1)), f"{version} {option}: {line!r}"
            classifier.feed(line)
        assert classifier.failure is None and classifier.phase == "starting", (version, option, classifier.failure)
