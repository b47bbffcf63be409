"""The real SGLang / FlashInfer source, unpacked from the wheels by ``scripts/setup.sh --test``.

A location is ``<dist>-<version>:<path>:<line>`` (``sglang-0.5.23:sglang/srt/utils/watchdog.py:217``)
or, for SGLang, ``<version>:<path under sglang/srt/>:<line>``; ``<line>+<line>`` names a message
built in several statements (``msg = "..."; msg += f"..."``), concatenated. The string a log call formats
there (an f-string, implicit concatenations included, or a %-format literal) is turned into a
regex (what any rendering of it looks like) or rendered with sample values (a line as SGLang
would print it). Names of module constants inside an f-string (``{CUDA_GRAPH_CAPTURE_FAILED_MSG}``)
are followed through the file's imports to their literal text.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / ".whl" / "src"
DISTS = ("sglang-0.5.8.post1", "sglang-0.5.9", "sglang-0.5.23", "flashinfer_python-0.6.3", "flashinfer_python-0.7.2")
SGLANG_VERSIONS = tuple(d.removeprefix("sglang-") for d in DISTS if d.startswith("sglang-"))
# printf-style placeholders of logger.info("... %s ...", value)
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-+ #0]*\d*(?:\.\d+)?[sdrfgeixX]")


class MissingWheels(Exception):
    pass


def require_wheels() -> None:
    missing = [d for d in DISTS if not (ROOT / d / ".unpacked").is_file()]
    if missing:
        raise MissingWheels(f"the real wheels {', '.join(missing)} are not unpacked under {ROOT}: "
                            "run scripts/setup.sh --test")


@dataclass(frozen=True)
class Location:
    dist: str
    path: str
    lines: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Location:
        head, path, lines = text.rsplit(":", 2)
        if head in SGLANG_VERSIONS:
            head, path = f"sglang-{head}", f"sglang/srt/{path}"
        return cls(head, path, tuple(int(n) for n in lines.split("+")))

    @property
    def line(self) -> int:
        return self.lines[0]

    @property
    def file(self) -> Path:
        return ROOT / self.dist / self.path

    def __str__(self) -> str:
        return f"{self.dist}:{self.path}:{'+'.join(map(str, self.lines))}"


@cache
def _tree(file: Path) -> ast.Module:
    return ast.parse(file.read_text(encoding="utf-8"), str(file))


@cache
def source_lines(file: Path) -> tuple[str, ...]:
    return tuple(file.read_text(encoding="utf-8").splitlines())


def _is_string(node: ast.AST) -> bool:
    """An f-string, a str literal, or a sum with one (``" Ninja output:\\n" + e.output``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_string(node.left) or _is_string(node.right)
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def string_at(loc: Location, line: int) -> ast.expr:
    """The outermost string expression (f-string, literal or sum) that spans ``line`` of ``loc``'s file."""
    if not loc.file.is_file():
        raise AssertionError(f"{loc}: no such file in the wheel")
    best: ast.expr | None = None
    for node in ast.walk(_tree(loc.file)):
        spans = _is_string(node) and node.lineno <= line <= (node.end_lineno or node.lineno)
        if spans and (best is None or (node.end_lineno or 0) - node.lineno > (best.end_lineno or 0) - best.lineno):
            best = node
    if best is None:
        raise AssertionError(f"{loc}: no string literal on line {line}")
    return best


def _constant(file: Path, name: str, dist: str) -> str | None:
    """A module-level string constant ``name`` of ``file``, or of the module it imports it from."""
    tree = _tree(file)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            base = ROOT / dist / node.module.replace(".", "/")
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return _constant(candidate, name, dist)
    return None


def _parts(loc: Location) -> list[tuple[str, object]]:
    """("text", literal) and ("value", FormattedValue | printf spec) pieces of the string(s) at ``loc``."""
    return [part for line in loc.lines for part in _parts_of(loc, string_at(loc, line))]


def _parts_of(loc: Location, node: ast.expr) -> list[tuple[str, object]]:
    if isinstance(node, ast.BinOp):
        return _parts_of(loc, node.left) + _parts_of(loc, node.right)
    if not _is_string(node):
        return [("value", node)]
    if isinstance(node, ast.Constant):
        text, out, last = node.value, [], 0
        for m in _PRINTF.finditer(text):
            out += [("text", text[last:m.start()]), ("value", m.group())]
            last = m.end()
        return out + [("text", text[last:])]
    out = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            out.append(("text", value.value))
            continue
        assert isinstance(value, ast.FormattedValue)
        if isinstance(value.value, ast.Name) and value.conversion == -1 and value.format_spec is None:
            constant = _constant(loc.file, value.value.id, loc.dist)
            if constant is not None:
                out.append(("text", constant))
                continue
        out.append(("value", value))
    return out


def expression(value: object) -> str:
    """The source of a placeholder's expression (``self.capture_bs``), or the printf spec itself."""
    if isinstance(value, ast.FormattedValue):
        return ast.unparse(value.value)
    return ast.unparse(value) if isinstance(value, ast.AST) else str(value)


def pattern(loc: Location, fixed: Mapping[str, str] | None = None) -> re.Pattern[str]:
    """A regex every rendering of the string at ``loc`` fully matches; expressions in ``fixed``
    (``graph_backend[model_runner.device]``: ``CUDA graph`` on CUDA) are taken as that text."""
    fixed = fixed or {}
    regex = ""
    for kind, piece in _parts(loc):
        if kind == "text":
            regex += re.escape(str(piece))
        elif expression(piece) in fixed:
            regex += re.escape(fixed[expression(piece)])
        else:
            regex += "(?:.*?)"
    return re.compile(regex, re.DOTALL)


def render(loc: Location, samples: Mapping[str, object]) -> str:
    """The string at ``loc`` as SGLang prints it, each expression replaced by its sample value
    (a number formatted with the real format spec), or ``x`` (``1.00`` for a float) when the
    test has none for it."""
    out = ""
    for kind, piece in _parts(loc):
        if kind == "text":
            out += str(piece)
            continue
        name = expression(piece)
        spec = ast.unparse(piece.format_spec)[2:-1] if isinstance(piece, ast.FormattedValue) \
            and piece.format_spec is not None else ""
        conversion = spec[-1:] if isinstance(piece, ast.FormattedValue) else piece[-1:] if isinstance(piece, str) else ""
        value = samples.get(name, 1.0 if conversion and conversion in "fFeEgG%" else 1 if conversion == "d" else "x")
        if isinstance(piece, ast.FormattedValue):
            if piece.conversion == ord("r"):
                value = repr(value)
            out += format(value, spec) if not isinstance(value, str) or not spec else value
        elif isinstance(piece, ast.AST):
            out += str(value)
        else:
            out += str(value) if piece in ("%s", "%r") else piece % value
    return out


def function_at(loc: Location) -> str | None:
    """The innermost function whose body holds ``loc.line``."""
    best: ast.AST | None = None
    for node in ast.walk(_tree(loc.file)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.lineno <= loc.line <= (node.end_lineno or node.lineno) \
                and (best is None or node.lineno > best.lineno):
            best = node
    return best.name if best is not None else None
