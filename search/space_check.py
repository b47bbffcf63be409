"""Checking a space against an SGLang flag manifest: every problem in one run, as `Problem` lines.

`search.space` says what a well-formed space is; this module says whether the SGLang that
`manifest` describes accepts it: every flag known and spelled in full, values its parser takes,
bool params on switches, and the rendered baseline command parsed as a whole.
"""

from __future__ import annotations

import difflib
from typing import Any

from search.errors import BadInput
from search.layout_check import layout_problems
from search.loadtest.workload import dataset_requests
from search.manifests import Flag, Manifest, ManifestError
from search.profile import flag_tokens, is_secret, render, secret_problems
from search.space import (
    ENV_NAME,
    BoolParam,
    CategoricalParam,
    CheckReport,
    FloatParam,
    Problem,
    Space,
    is_flag,
)

# Flag kinds a bool param can switch: present = on, absent = off.
_SWITCH_KINDS = frozenset({"store_true", "deprecated_store_true"})


def check_space(space: Space, manifest: Manifest, host_gpus: int | None = None) -> CheckReport:
    """Every problem of `space` for the SGLang whose flags `manifest` lists (errors + warnings); with
    ``host_gpus``, also the parallel layouts that host cannot hold (`search.layout_check`)."""
    report = CheckReport()
    add = report.problems.extend
    add(_structure_problems(space))
    add(secret_problems(space))
    claimed: dict[str, str] = {}
    for key, option, value in space.launch.options():
        flag = _claim(space, manifest, option, "launch", claimed, report)
        if flag is not None:
            add(value_problems(manifest, flag, option, value, space.source, key))
    for option, value in space.launch.flags.items():
        key = f"launch.flags.{option}"
        flag = _claim(space, manifest, option, key, claimed, report)
        if flag is not None and value is not None and value is not False:
            add(value_problems(manifest, flag, option, value, space.source, key))
    for name, param in space.params.items():
        key = f"params.{name}"
        if is_flag(name):
            flag = _claim(space, manifest, name, key, claimed, report)
            if flag is not None:
                add(_param_problems(space, manifest, flag, name, param, key))
        elif not ENV_NAME.match(name):
            add([space._problem(key, f"{name!r} is neither a flag (--name) nor a valid env var name",
                                "letters, digits and _, not starting with a digit")])
    if space.baseline is not None and report.ok:
        add(_argv_problems(space, manifest, space.baseline, "baseline"))
    if report.ok:
        add(layout_problems(space, host_gpus))
    return report


def _claim(space: Space, manifest: Manifest, option: str, key: str, claimed: dict[str, str],
           report: CheckReport) -> Flag | None:
    """Resolve `option`, report unknown/abbreviated/deprecated/duplicate; the flag or None."""
    flag = manifest.flag(option) if is_flag(option) else None
    if flag is None:
        report.problems.append(space._problem(key, unknown_flag(manifest, option)))
        return None
    if flag.dest in claimed and key != "launch":
        fix = " (set launch.tp: null to search it)" if claimed[flag.dest] == "launch (--tp-size)" else ""
        report.problems.append(space._problem(key, f"{option} sets {flag.dest}, already set by {claimed[flag.dest]}{fix}"))
    claimed.setdefault(flag.dest, key if key != "launch" else f"launch ({option})")
    if option not in flag.options:
        report.problems.append(space._problem(key, f"{option} abbreviates {flag.options[0]}; write it in full "
                                              "(abbreviations break when a later SGLang adds a flag)", warning=True))
    report.problems.extend(deprecation(manifest, flag, option, space.source, key))
    return flag


def deprecation(manifest: Manifest, flag: Flag, option: str, source: str, key: str) -> list[Problem]:
    """A warning naming the replacement when SGLang marks the flag deprecated."""
    if not flag.deprecated and not flag.kind.startswith("deprecated"):
        return []
    instead = flag.replacement or flag.new_flag
    use = f"; use {instead} instead" if instead else ""
    return [Problem(source, key, f"{option} is deprecated in SGLang {manifest.version}{use}", warning=True)]


def unknown_flag(manifest: Manifest, option: str) -> str:
    """`unknown flag --x in SGLang V`, with the closest real options when there are any."""
    names = [o for f in manifest.flags for o in f.options if o.startswith("--")]
    close = difflib.get_close_matches(option, names, n=3, cutoff=0.75)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return f"unknown flag {option} in SGLang {manifest.version}{hint}"


def value_problems(manifest: Manifest, flag: Flag, option: str, value: Any, source: str, key: str) -> list[Problem]:
    """Whether SGLang's parser accepts `value` for `flag`, in our words."""
    if flag.choices is not None and not isinstance(value, (bool, list)) and str(value) not in map(str, flag.choices):
        return [Problem(source, key, f"{value!r} is not a choice of {option}", ", ".join(map(str, flag.choices)))]
    if value is True and flag.takes_value:
        return [Problem(source, key, f"{option} takes a value, not true", _flag_type(flag))]
    if not flag.takes_value and value is not True:
        return [Problem(source, key, f"{option} is a switch: write true (present) or omit it", "true")]
    try:
        manifest.parse(["--model-path", "probe", *flag_tokens(option, value)])
    except ManifestError as exc:
        return [Problem(source, key, str(exc), _flag_type(flag))]
    return []


def _flag_type(flag: Flag) -> str:
    kind = "switch" if not flag.takes_value else (flag.type or "str")
    return kind + (f" (nargs {flag.nargs})" if flag.nargs not in (None, 0) else "")


def _param_problems(space: Space, manifest: Manifest, flag: Flag, name: str, param: Any, key: str) -> list[Problem]:
    if isinstance(param, BoolParam):
        if flag.kind not in _SWITCH_KINDS:
            return [space._problem(key, f"type bool needs a store_true flag; {name} is {_flag_type(flag)}",
                                   "categorical with the values to try")]
        return []
    if flag.kind in _SWITCH_KINDS:
        return [space._problem(key, f"{name} is a store_true switch; use type: bool", "bool")]
    if not flag.takes_value or flag.kind not in ("store", "deprecated_alias"):
        return [space._problem(key, f"{name} ({flag.kind}) cannot be searched", "store flags and store_true switches")]
    if isinstance(param, FloatParam) and flag.type not in ("float", None, "str"):
        return [space._problem(key, f"type float but {name} takes {flag.type}", f"type {flag.type}")]
    values = param.choices if isinstance(param, CategoricalParam) else [param.low, param.high]
    out: list[Problem] = []
    for i, value in enumerate(values):
        if value is None:
            continue
        where = f"{key}.choices[{i}]" if isinstance(param, CategoricalParam) else f"{key}.{('low', 'high')[i]}"
        out.extend(value_problems(manifest, flag, name, value, space.source, where))
    return out


def _structure_problems(space: Space) -> list[Problem]:
    """Manifest-free problems: conditions, cycles, env names, secrets, targets, baseline shape."""
    out: list[Problem] = []
    for name, param in space.params.items():
        for other, wanted in param.when.items():
            key = f"params.{name}.when.{other}"
            if other == name:
                out.append(space._problem(key, "a param cannot be conditioned on itself"))
            elif other not in space.params:
                out.append(space._problem(key, f"condition names unknown param {other}", ", ".join(space.params)))
            else:
                for w in wanted if isinstance(wanted, list) else [wanted]:
                    if not space.params[other].contains(w):
                        out.append(space._problem(key, f"{other} can never be {w!r}", space.params[other].allowed()))
    order = space.order()
    for i, name in enumerate(order):
        if any(dep in space.params and dep not in order[:i] for dep in space.params[name].when if dep != name):
            out.append(space._problem(f"params.{name}.when", "conditions form a cycle"))
    for name in space.launch.env:
        key = f"launch.env.{name}"
        if not ENV_NAME.match(name):
            out.append(space._problem(key, f"{name!r} is not a valid env var name", "letters, digits and _, not starting with a digit"))
        if is_secret(name):
            out.append(space._problem(key, "a secret value is written in the space file",
                                      f"list {name} in launch.secret_env; it is read from your environment at start"))
    for name in space.launch.secret_env:
        if not ENV_NAME.match(name):
            out.append(space._problem(f"launch.secret_env.{name}", f"{name!r} is not a valid env var name"))
    for name in space.params:
        if not is_flag(name) and name in space.launch.env:
            out.append(space._problem(f"params.{name}", "also fixed in launch.env"))
    ladder = space.load_test.concurrency
    for level in space.targets:
        if level not in ladder:
            out.append(space._problem(f"targets.{level}", "not a level of load_test.concurrency", ", ".join(map(str, ladder))))
    if (dataset := space.dataset_path()) is not None:
        try:
            dataset_requests(str(dataset), space.load_test.output_len, 0, space.load_test.api)
        except BadInput as exc:
            out.append(space._problem("workload.file", str(exc), "a JSON or JSONL file of requests"))
    if space.baseline is not None:
        out.extend(space.config_problems(space.baseline, "baseline"))
    return out


def _argv_problems(space: Space, manifest: Manifest, config: dict[str, Any], key: str) -> list[Problem]:
    """The rendered argv of `config` through the manifest's parser: whatever only the whole shows."""
    try:
        manifest.parse(render(space, config).args)
    except ManifestError as exc:
        return [space._problem(key, f"SGLang {manifest.version} rejects the rendered command: {exc}")]
    return []
