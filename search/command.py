"""A user's own launch command: parse it, check it, and map it onto a space.

Users paste what they run today (`NCCL_P2P_LEVEL=5 python3 -u -m sglang.launch_server \\ ...`);
`search space check --command` validates it per flag, and `config_from_command` turns it into
the space config a study starts from.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from search.errors import BadInput
from search.manifests import Manifest, ManifestError, load
from search.profile import is_secret
from search.secret_rule import SECRET_VALUE, secret_advice
from search.space import (
    ENV_NAME,
    BoolParam,
    CategoricalParam,
    CheckReport,
    FloatParam,
    IntParam,
    Problem,
    Space,
    is_flag,
)
from search.space_check import deprecation, unknown_flag, value_problems

SOURCE = "<command>"
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z", re.DOTALL)
_SHELL_END = re.compile(r"(&&?|\|\|?|;|\d*[<>].*|[<>].*)\Z")
_PREFIXES = {"env", "nohup", "exec", "sudo", "-E"}
# Where the server listens differs between a user's box and the study; never a mismatch.
_WHERE = {"host", "port"}


@dataclass(frozen=True)
class Command:
    env: dict[str, str]
    launcher: list[str]
    args: list[str]


def parse_command(text: str) -> Command:
    """Split a shell launch command into env assignments, the launcher and SGLang's args.

    Handles backslash-newline continuations, quoting, `env`/`nohup` prefixes, interpreter
    options (`python3 -u -m sglang.launch_server`), `sglang serve`, and stops at redirections.
    """
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise BadInput(f"cannot split the launch command ({exc}); check its quotes") from None
    for i, token in enumerate(tokens):
        if _SHELL_END.match(token):
            tokens = tokens[:i]
            break
    env: dict[str, str] = {}
    i = 0
    while i < len(tokens) and (tokens[i] in _PREFIXES or _ASSIGN.match(tokens[i])):
        if m := _ASSIGN.match(tokens[i]):
            env[m.group(1)] = m.group(2)
        i += 1
    rest = tokens[i:]
    for j, token in enumerate(rest):
        if token in ("sglang.launch_server", "sglang.launch_server.py") or token.endswith("/launch_server.py"):
            return Command(env, rest[: j + 1], rest[j + 1 :])
        if token == "serve" and j > 0 and rest[j - 1].endswith("sglang"):
            return Command(env, rest[: j + 1], rest[j + 1 :])
    raise BadInput("no `python -m sglang.launch_server` (or `sglang serve`) in the launch command; paste the whole command")


def _options(args: list[str]) -> list[tuple[str, list[str]]]:
    """(option as written, its values) in order; `--flag=value` split like argparse does."""
    out: list[tuple[str, list[str]]] = []
    for token in args:
        if token.startswith("--"):
            option, eq, value = token.partition("=")
            out.append((option, [value] if eq else []))
        elif out:
            out[-1][1].append(token)
        else:
            out.append(("", [token]))
    return out


def check_command(text: str, manifest: Manifest) -> CheckReport:
    """Every problem of a launch command for `manifest`'s SGLang, flag by flag."""
    command = parse_command(text)
    report = CheckReport()
    for name in command.env:
        if not ENV_NAME.match(name):
            report.problems.append(Problem(SOURCE, f"env {name}", "not a valid env var name"))
    report.problems.extend(_secrets(command, manifest))
    for option, values in _options(command.args):
        if not option:
            report.problems.append(Problem(SOURCE, values[0], "a value without a flag"))
            continue
        flag = manifest.flag(option)
        if flag is None:
            report.problems.append(Problem(SOURCE, option, unknown_flag(manifest, option)))
            continue
        value: Any = True if not values else values[0] if len(values) == 1 and flag.nargs in (None, "?") else values
        report.problems.extend(deprecation(manifest, flag, option, SOURCE, option))
        report.problems.extend(value_problems(manifest, flag, option, value, SOURCE, option))
    if report.ok:
        try:
            manifest.parse(command.args)
        except ManifestError as exc:
            report.problems.append(Problem(SOURCE, "(command)", str(exc)))
    return report


def config_from_command(space: Space, text: str) -> dict[str, Any]:
    """The config of `space` that `text` launches; BadInput names every value that does not fit."""
    manifest = load(space.sglang_version)
    command = parse_command(text)
    try:
        values = manifest.parse(command.args).values
    except ManifestError as exc:
        raise BadInput(f"SGLang {space.sglang_version} rejects the launch command: {exc}") from None
    given = {flag.dest for option, _ in _options(command.args) if (flag := manifest.flag(option))}
    config: dict[str, Any] = {}
    problems: list[str] = []
    for name, param in space.params.items():
        if is_flag(name):
            flag = manifest.flag(name)
            if flag is None:
                raise BadInput(f"{space.source}: params.{name}: unknown flag; run `search space check`")
            present = flag.dest in given
            raw = values[flag.dest] if present else None
            value = present if isinstance(param, BoolParam) else raw
            if not present and not isinstance(param, BoolParam) and not param.contains(None):
                value = flag.default
        else:
            value = _from_env(param, command.env.get(name))
        if value is None and not param.contains(None):
            continue  # absent, and SGLang's default is no point of the space: reported as missing below
        config[name] = value
    config = space.active(config)
    fixed = _fixed_values(space, manifest)
    searched = {flag.dest for n in space.params if is_flag(n) and (flag := manifest.flag(n)) is not None}
    for option, _ in _options(command.args):
        flag = manifest.flag(option)
        if flag is None or flag.dest in searched or flag.dest in _WHERE or is_secret(flag.dest):
            continue
        if flag.dest not in fixed:
            problems.append(f"{option}: set in the command but not in the space (add it to launch.flags or params)")
        elif values[flag.dest] != fixed[flag.dest]:
            problems.append(f"{option}: {values[flag.dest]!r} in the command but {fixed[flag.dest]!r} in the space")
    problems += [f"{p.key}: {p.message}; {p.allowed}" for p in _secrets(command, manifest)]
    for name, raw in command.env.items():
        fixed_env = space.launch.env.get(name)
        if is_secret(name):
            continue
        if name not in space.params and fixed_env is None:
            problems.append(f"{name}: set in the command but not in the space (add it to launch.env or params)")
        elif fixed_env is not None and str(fixed_env) != raw:
            problems.append(f"{name}: {raw!r} in the command but {str(fixed_env)!r} in the space")
    problems += [f"{p.key.removeprefix('start.')}: {p.message}" + (f" (allowed: {p.allowed})" if p.allowed else "")
                 for p in space.config_problems(config, "start")]
    if problems:
        raise BadInput(f"the launch command does not fit {space.source}: " + "; ".join(problems))
    return config


def _secrets(command: Command, manifest: Manifest) -> list[Problem]:
    """A problem for each secret whose value the command holds (an env assignment or a valued flag)."""
    names = [f"env {name}" for name in command.env if is_secret(name)]
    names += [option for option, values in _options(command.args)
              if values and (flag := manifest.flag(option)) is not None and is_secret(flag.dest)]
    return [Problem(SOURCE, name, SECRET_VALUE, secret_advice(name.removeprefix("env "))) for name in names]


def _fixed_values(space: Space, manifest: Manifest) -> dict[str, Any]:
    """dest -> value for each flag the space's fixed launch sets."""
    from search.profile import render

    args = render(space, {}).args
    values = manifest.parse(args).values
    return {f.dest: values[f.dest] for option, _ in _options(args) if (f := manifest.flag(option))}


def _from_env(param: Any, raw: str | None) -> Any:
    """An env var's text as the param's type; None when unset (or unparseable, reported by the caller)."""
    if raw is None:
        return None
    if isinstance(param, BoolParam):
        return raw not in ("", "0", "false", "False")
    if isinstance(param, IntParam):
        return int(raw) if re.fullmatch(r"-?\d+", raw) else raw
    if isinstance(param, FloatParam):
        try:
            return float(raw)
        except ValueError:
            return raw
    assert isinstance(param, CategoricalParam)
    return next((c for c in param.choices if c is not None and str(c) == raw), raw)
